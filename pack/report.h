/* Human and JSON reports of a checked source (check-source, convert). */
#ifndef KPACK_REPORT_H
#define KPACK_REPORT_H

#include "source.h"

#include <jansson.h>
#include <stdio.h>

void kr_source_print(const k3_source *src, FILE *out);
json_t *kr_source_json(const k3_source *src);
/* Only the problems, for convert's refusal. */
void kr_source_problems(const k3_source *src, FILE *out);

#endif
