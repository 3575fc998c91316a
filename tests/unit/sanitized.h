/* SANITIZED: 1 in a build under ASan or MSan (gcc's __SANITIZE_ADDRESS__, clang's
 * __has_feature), whose own allocator the probes' counting wrappers would bypass. */
#ifndef KPK_TEST_SANITIZED_H
#define KPK_TEST_SANITIZED_H

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#endif
