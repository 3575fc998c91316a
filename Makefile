# kpk: Kimi K3 on small machines.  `make` builds bin/kpack, bin/krun, bin/k3synth.
# `make test` runs the fast suite; `make bench` the long measurements; `make demo`
# the end-to-end tour.  Everything is C11, warnings are errors.

CC      ?= cc
OPT     ?= -O2
# Cross builds: `make CROSS=aarch64-linux-gnu-` compiles with that prefix's gcc
# and ar (Debian's gcc-aarch64-linux-gnu; the arm64 -dev packages through
# multiarch: tests/deps.sh arm64) into build/aarch64-linux-gnu.  A CC given on
# the command line wins: CROSS=aarch64-linux-gnu- CC="clang --target=aarch64-linux-gnu".
ifneq ($(CROSS),)
  ifeq ($(origin CC),default)
    CC := $(CROSS)gcc
  endif
  ifeq ($(origin AR),default)
    AR := $(CROSS)ar
  endif
  BUILD ?= build/$(patsubst %-,%,$(CROSS))
endif
# -ffp-contract=off: the floating-point contract (docs/NUMERICS.md) forbids the
# compiler from fusing a*b+c, so the scalar and SIMD paths give the same bits.
CFLAGS  ?= $(OPT) -g
# `override`: a CFLAGS given on the command line (make CFLAGS=-O3) or in the
# environment keeps the warnings and, above all, the floating-point contract
# flags: they are appended whatever the caller sets.
override CFLAGS += -std=c11 -Wall -Wextra -Werror -Wvla -ffp-contract=off -fno-fast-math \
           -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -I. -MMD -MP
# gcc only (clang has no such warning and -Werror refuses unknown ones):
# diagnostics are built with snprintf into fixed buffers on purpose; a long
# path may shorten a message, never overflow it.
CC_IS_CLANG := $(shell $(CC) --version 2>/dev/null | grep -q clang && echo 1)
ifneq ($(CC_IS_CLANG),1)
  override CFLAGS += -Wno-format-truncation
endif
# CPPFLAGS and LDFLAGS as the caller gives them (Debian's hardening flags: debian/rules).
LDLIBS  += -lzstd -lxxhash -lcrypto -ljansson -lpcre2-8 -lmicrohttpd -lpthread -lm
# Open MPI (Debian: libopenmpi-dev): krun over several machines under mpirun
# (run/cluster).  Found through pkg-config (ompi-c) in a native build; without
# it krun still builds, and says what is missing when mpirun starts it.
# KRUN_MPI=0 builds without it anyway.
ifeq ($(CROSS)$(KRUN_MPI),)
  MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
  MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null)
endif
ifneq ($(MPI_LIBS),)
  LDLIBS += $(MPI_LIBS)
endif

BUILD   ?= build
# The ablation build (test only): every spec trap compiled in, selected at run
# time by KRUN_ABLATE=NAME.  Normal builds never contain the broken code.
ifneq ($(ABLATIONS),)
  override CFLAGS += -DKRUN_ABLATIONS
endif

# The target's architecture picks the SIMD kernel files: *_avx2.c and
# *_avx512.c (GCC target pragmas, x86 intrinsics) only for x86-64, *_neon.c
# only for aarch64, neither elsewhere (the scalar kernels alone).
KPK_ARCH := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine 2>/dev/null)))
SIMD_X86  := %_avx2.c %_avx512.c
SIMD_NEON := %_neon.c
ifeq ($(KPK_ARCH),x86_64)
  SIMD_SKIP := $(SIMD_NEON)
else ifeq ($(KPK_ARCH),aarch64)
  SIMD_SKIP := $(SIMD_X86)
else
  SIMD_SKIP := $(SIMD_X86) $(SIMD_NEON)
endif

FORMAT_SRC := $(sort $(wildcard format/*.c))
PACK_SRC   := $(sort $(filter-out pack/main.c,$(wildcard pack/*.c)))
# run/ is one folder per layer (run/LAYERS); its main() is the dispatcher in run/cli.
RUN_SRC    := $(sort $(filter-out run/cli/main.c $(SIMD_SKIP),$(wildcard run/*/*.c)))
SYNTH_SRC  := $(sort $(wildcard tests/synth/*.c))
UNIT_SRC   := $(sort $(wildcard tests/unit/test_*.c))
# probes: test programs the CLI tests drive on a synthesized model
PROBE_SRC  := $(sort $(wildcard tests/unit/probe_*.c))

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))

LIBFORMAT := $(BUILD)/libkpkformat.a
LIBPACK   := $(BUILD)/libkpack.a
LIBRUN    := $(BUILD)/libkrun.a
UNIT_BIN  := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC) $(PROBE_SRC))

# The default build puts its tools in bin/; any other build (ablations,
# sanitizers) keeps its own copies under its build directory.
BINDIR := $(if $(filter build,$(BUILD)),bin,$(BUILD)/bin)

.PHONY: all test test-clang test-root bench bench-hdd demo deps clean unit asan ablate fuzz fuzz-bins soak soak-serve soak-batch check-layers \
        test-arm64 test-arm64-full arm64-bins install install-strip uninstall
# keep the unit tests' objects (make would delete them as intermediates)
.SECONDARY:
all: $(BINDIR)/kpack $(BINDIR)/k3synth $(if $(wildcard run/cli/main.c),$(BINDIR)/krun)

# V=1 shows the full command lines.
Q := $(if $(V),,@)
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# only the transport sees <mpi.h> (-isystem: its header is not held to our warnings)
$(BUILD)/run/cluster/kcl_mpi.o: override CFLAGS += $(if $(MPI_LIBS),-DKRUN_MPI $(patsubst -I%,-isystem %,$(MPI_CFLAGS)))

$(LIBFORMAT): $(call obj,$(FORMAT_SRC))
	@mkdir -p $(dir $@)
	$(Q)$(AR) rcs $@ $^
$(LIBPACK): $(call obj,$(PACK_SRC))
	@mkdir -p $(dir $@)
	$(Q)$(AR) rcs $@ $^
$(LIBRUN): $(call obj,$(RUN_SRC))
	@mkdir -p $(dir $@)
	$(Q)$(AR) rcs $@ $^

# krun serve's page (GET /): run/serve/ui/'s HTML, CSS and JS as one document in a C array, made
# by a POSIX sh script (od, sed, wc), so any target and compiler builds it (serve_ui.c serves it).
UI_FILES := run/serve/ui/index.html run/serve/ui/page.css run/serve/ui/page.js
$(BUILD)/gen/ui_page.c: run/serve/ui/embed.sh $(UI_FILES)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  EMBED   $(UI_FILES)")
	$(Q)sh run/serve/ui/embed.sh $@ $(UI_FILES)
$(BUILD)/gen/ui_page.o: $(BUILD)/gen/ui_page.c
	@$(if $(V),true,echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@
$(LIBRUN): $(BUILD)/gen/ui_page.o

$(BINDIR)/kpack: $(call obj,pack/main.c) $(LIBPACK) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BINDIR)/krun: $(call obj,run/cli/main.c) $(LIBRUN) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
# k3synth uses krun's tokenizer (only it, and its error type) to write and check tokenizer files.
$(BINDIR)/k3synth: $(call obj,$(SYNTH_SRC) run/text/tokenizer.c run/text/tokenizer_specials.c run/util/krun_err.c) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Every unit test links against all three libraries; the linker takes only what it uses.
$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(LIBRUN) $(LIBPACK) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Fuzzing.  Every tests/fuzz/fuzz_NAME.c is one libFuzzer harness (adding a
# harness is adding that file): `make fuzz` builds each with clang, ASan and
# UBSan into build/fuzz/fuzz/ and runs it (tests/fuzz/run_fuzz.sh); every
# build also links it with a replay driver into $(BUILD)/tests/fuzz_replay_NAME,
# which tests/cli/test_fuzz_replay.sh runs on the regression inputs and seeds.
FUZZ_NAMES  := $(patsubst tests/fuzz/fuzz_%.c,%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_REPLAY := $(patsubst %,$(BUILD)/tests/fuzz_replay_%,$(FUZZ_NAMES))
FUZZ_BIN    := $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_NAMES))
FUZZ_SECONDS ?= 60
FUZZ_FLAGS  := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# FUZZ_CMP=0: no comparison tracing (libFuzzer's CMP/value hints), for long
# runs of 10^7 executions: 3.5x the executions per second on fuzz_schema, whose
# grammar walk is mostly bitset loops; coverage still steers.  Its own build
# directory, so the objects of the two builds never mix.
FUZZ_DIR    := build/fuzz$(if $(filter 0,$(FUZZ_CMP)),-nocmp)
FUZZ_FLAGS  += $(if $(filter 0,$(FUZZ_CMP)),-fno-sanitize-coverage=trace-cmp)

$(BUILD)/tests/fuzz_replay_%: $(call obj,tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/input_file.c) $(LIBRUN) $(LIBPACK) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/fuzz/fuzz_%: $(call obj,tests/fuzz/fuzz_%.c tests/fuzz/input_file.c) $(LIBRUN) $(LIBPACK) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)
fuzz-bins: $(FUZZ_BIN)
# run/kernels/*.c do not build with clang 14 (GCC target pragmas, the "f16c"
# cpu feature): the fuzz build takes them from gcc, uninstrumented.  No
# harness fuzzes the kernels; fuzz_kpk only links them through run/model/model.c.
ifeq ($(FUZZ_KERNELS_GCC),1)
$(call obj,$(filter-out $(SIMD_SKIP),$(wildcard run/kernels/*.c))): $(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  GCC     $<")
	$(Q)gcc $(filter-out -fsanitize%,$(CFLAGS)) -Wno-format-truncation -c $< -o $@
endif

# clang (Debian clang + libclang-rt-14-dev); FUZZ_SECONDS=N per harness, or
# FUZZ_RUNS=N executions; FUZZ_ONLY=kpk,config; FUZZ_CMP=0 (above).  Prints
# figures per harness.
fuzz: all
	@tests/deps.sh fuzz >/dev/null || { echo "make fuzz needs clang and libclang-rt-14-dev: tests/deps.sh fuzz"; exit 2; }
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_DIR) CC=clang OPT="$(FUZZ_FLAGS)" FUZZ_KERNELS_GCC=1 fuzz-bins
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_ONLY=$(FUZZ_ONLY) FUZZ_BUILD=$(FUZZ_DIR) BIN=$(BINDIR) tests/fuzz/run_fuzz.sh

# The fault-injection shim (tests/fault/kfault.c), LD_PRELOADed by the tests.
# Never sanitized: it is loaded before the sanitizer runtime and only passes
# calls on to the kernel.
KFAULT := $(BUILD)/tests/libkfault.so
$(KFAULT): tests/fault/kfault.c
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  SHLIB   $@")
	$(Q)$(CC) -std=gnu11 -O2 -g -fPIC -shared -Wall -Wextra -Werror -Wvla -o $@ $<

# The cluster's test tools (only where Open MPI is): a krun built without MPI
# (kcl_mpi.c's stand-in, what a build without libopenmpi-dev says under
# mpirun), and tests/fault/kmpifault.c, LD_PRELOADed: a rank's N-th send fails.
KMPIFAULT  := $(BUILD)/tests/libkmpifault.so
KRUN_NOMPI := $(BUILD)/tests/krun_nompi
$(KMPIFAULT): tests/fault/kmpifault.c
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  SHLIB   $@")
	$(Q)$(CC) -std=gnu11 -O2 -g -fPIC -shared -Wall -Wextra -Werror $(MPI_CFLAGS) -o $@ $< $(MPI_LIBS)
$(BUILD)/nompi/kcl_mpi.o: run/cluster/kcl_mpi.c
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  CC      $< (without MPI)")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@
$(KRUN_NOMPI): $(call obj,run/cli/main.c) $(BUILD)/nompi/kcl_mpi.o $(LIBRUN) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(filter-out $(MPI_LIBS),$(LDLIBS))

unit: $(UNIT_BIN) $(FUZZ_REPLAY) $(KFAULT) $(if $(MPI_LIBS),$(KMPIFAULT) $(KRUN_NOMPI))

# Under this build's directory, so a sanitizer build's ablations are not mixed
# with the plain build's.
ablate:
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/ablate ABLATIONS=1 $(BUILD)/ablate/bin/krun $(BUILD)/ablate/tests/probe_draft

# The layers of run/ (run/LAYERS): every include of the sources and every call
# between the objects go only the way the rules allow, with no cycle between
# folders (tests/layers/check_layers.py; tests/cli/test_layers.sh proves it fails).
check-layers: $(LIBFORMAT) $(LIBPACK) $(LIBRUN)
	@python3 tests/layers/check_layers.py --objects $(BUILD)
	@echo "check-layers: run/LAYERS kept by every include and every call"

test: all unit ablate check-layers
	@BUILD=$(BUILD) BIN=$(BINDIR) tests/run_all.sh

# Tests that need root (loop mounts): out of space on a real ext4, --consume on one.
test-root: all unit
	@BUILD=$(BUILD) BIN=$(BINDIR) tests/run_all.sh tests/root/test_*.sh

# The randomized campaigns.  tests/soak/soak.py: kill -9 at random byte counts
# during convert (and during convert --consume), random bit flips, re-sealed
# structural mutations; figures;
# SOAK_ARGS="--kills N --consume-kills N --flips N --mutations N --seed S --json FILE".
# tests/soak/serve_soak.py (`make soak-serve` alone): 10,000 random requests to
# krun serve built with ASan/UBSan, with disconnects, half-closes and signals;
# SERVE_SOAK_ARGS="--requests N --epochs N --workers N --seed S --json FILE".
SOAK_ARGS ?= --kills 60 --consume-kills 40 --flips 1200 --mutations 1200 --json $(BUILD)/soak.json
SERVE_SOAK_ARGS ?= --requests 10000 --epochs 5 --json $(BUILD)/serve_soak.json
ASAN_OPT := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
K3_SHARED ?= $(abspath ..)/shared
soak: all unit soak-serve soak-batch
	@nice -n 10 python3 tests/soak/soak.py --bin $(BINDIR) --shim $(KFAULT) $(SOAK_ARGS)

# krun batch killed -9 at random moments BATCH_KILLS times (the suite does 3): the same command
# continues, and OUT is byte-identical to an uninterrupted run (tests/cli/test_krun_batch.sh).
BATCH_KILLS ?= 30
soak-batch: all unit
	@BATCH_KILLS=$(BATCH_KILLS) BUILD=$(BUILD) BIN=$(BINDIR) nice -n 10 tests/run_all.sh tests/cli/test_krun_batch.sh

soak-serve: all
	@$(MAKE) --no-print-directory BUILD=build/asan OPT="$(ASAN_OPT)" build/asan/bin/krun
	@nice -n 10 python3 tests/soak/serve_soak.py --krun build/asan/bin/krun --tools $(BINDIR) \
	    --tokenizer $(K3_SHARED)/fixtures/tokenizer/tiktoken.model $(SERVE_SOAK_ARGS)

bench: all
	@tests/bench/run_bench.sh

# krun on modelled HDDs (root: loop devices throttled by a block-I/O cgroup):
# 1, 2 and 4 drives, a trunk member on the fast disk, stripe units, compression.
bench-hdd: all
	@tests/bench/bench_hdd.sh

demo: deps all
	@tests/demo.sh

deps:
	@tests/deps.sh

# The same suite built with clang (CI runs it too): both compilers must accept
# the code with every warning an error, and give the same bits (test_krun.sh
# compares the clang krun with the gcc one in bin/, built first).
test-clang: all
	@$(MAKE) --no-print-directory CC=clang BUILD=build/clang test

# aarch64 under emulation (tests/arm64/run.sh): the cross build run by
# qemu-aarch64-static (tests/deps.sh arm64 installs both).  test-arm64 (CI):
# the unit suite, the scalar-vs-NEON bit identity (and a fused NEON build
# that must fail it), x86-64 == aarch64 ids and logit bits on the same KPK
# files (oracle, test_krun_ref's geometries, quantised MXFP4, compressed,
# streamed), the oracle and reference tests, and the libm functions.
# test-arm64-full: every unit and CLI test under emulation (2 hours or more),
# and the unit tests of a clang build (clang --target=aarch64-linux-gnu).
ARM64       ?= aarch64-linux-gnu-
ARM64_BUILD := build/$(patsubst %-,%,$(ARM64))
ARM64_CLANG := build/aarch64-clang
test-arm64 test-arm64-full: all $(BUILD)/tests/libm_probe
	@tests/deps.sh arm64 >/dev/null || { echo "make $@ needs the aarch64 cross compiler, the arm64 libraries and qemu-user-static: tests/deps.sh arm64 (as root)"; exit 2; }
	@$(MAKE) --no-print-directory CROSS=$(ARM64) BUILD=$(ARM64_BUILD) arm64-bins $(if $(filter test-arm64-full,$@),unit ablate)
	@$(if $(filter test-arm64-full,$@),$(MAKE) --no-print-directory CROSS=$(ARM64) CC="clang --target=$(patsubst %-,%,$(ARM64))" BUILD=$(ARM64_CLANG) arm64-bins)
	@ARM64_BUILD=$(ARM64_BUILD) ARM64_CLANG=$(ARM64_CLANG) X86_BUILD=$(BUILD) X86_BIN=$(BINDIR) tests/arm64/run.sh $(if $(filter test-arm64-full,$@),full)

# What the emulated suite runs besides `all unit`: libm_probe, and the kernel
# tests linked with NEON kernels built to fuse (KERN_NEON_FMA_TRAP), which
# must fail.  Test only; built in the cross build's directory.
FMATRAP_SRC := $(filter %/kernels_neon.c %/kernels_seq_neon.c,$(RUN_SRC))
FMATRAP_OBJ := $(patsubst %.c,$(BUILD)/fmatrap/%.o,$(FMATRAP_SRC))
$(FMATRAP_OBJ): $(BUILD)/fmatrap/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  CC      $< (fused, test only)")
	$(Q)$(CC) $(CFLAGS) -DKERN_NEON_FMA_TRAP -c $< -o $@
$(BUILD)/fmatrap/tests/%: $(BUILD)/tests/unit/%.o $(FMATRAP_OBJ) $(LIBRUN) $(LIBPACK) $(LIBFORMAT)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/tests/libm_probe: $(call obj,tests/arm64/libm_probe.c) $(LIBRUN)
	@mkdir -p $(dir $@)
	@$(if $(V),true,echo "  LINK    $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
arm64-bins: all $(filter $(BUILD)/tests/test_%,$(UNIT_BIN)) $(BUILD)/tests/libm_probe \
            $(if $(FMATRAP_SRC),$(BUILD)/fmatrap/tests/test_kernels $(BUILD)/fmatrap/tests/test_kernels_seq)

# Sanitizer and valgrind builds of the same suite.
# Shadow memory makes RSS meaningless under ASan: the RSS-bound checks skip.
asan:
	KPK_SANITIZED=1 $(MAKE) BUILD=build/asan OPT="$(ASAN_OPT)" test

clean:
	rm -rf build bin

# Installing (the GNU conventions: PREFIX or prefix, DESTDIR, and each directory its own
# variable; nothing is written outside them).  What goes where, and why k3synth does not:
# README.md, "Installing".  The Debian package (debian/rules) installs through these targets.
PREFIX      ?= /usr/local
prefix      ?= $(PREFIX)
exec_prefix ?= $(prefix)
bindir      ?= $(exec_prefix)/bin
datarootdir ?= $(prefix)/share
mandir      ?= $(datarootdir)/man
man1dir     ?= $(mandir)/man1
docdir      ?= $(datarootdir)/doc/kpk
sysconfdir  ?= $(prefix)/etc
bashcompdir ?= $(datarootdir)/bash-completion/completions
# systemd's own search paths include /usr/local/lib/systemd/...; Debian 12 installs under /lib
systemdunitdir      ?= $(prefix)/lib/systemd/system
systemdgeneratordir ?= $(prefix)/lib/systemd/system-generators
sysusersdir         ?= $(prefix)/lib/sysusers.d
INSTALL         ?= install
INSTALL_PROGRAM ?= $(INSTALL) -m 755
INSTALL_DATA    ?= $(INSTALL) -m 644
# The paths the unit, the generator and the pages name, as installed.
INSTALL_SUBST = sed -e 's|@bindir@|$(bindir)|g' -e 's|@sysconfdir@|$(sysconfdir)|g' -e 's|@docdir@|$(docdir)|g'
MAN_SUBST     = sed -e 's|/etc/krun|$(sysconfdir)/krun|g' -e 's|/usr/share/doc/kpk|$(docdir)|g'
INSTALL_DOCS  = README.md LICENSE $(sort $(wildcard docs/*.md))

install: all
	$(INSTALL) -d $(DESTDIR)$(bindir) $(DESTDIR)$(man1dir) $(DESTDIR)$(docdir)/docs $(DESTDIR)$(docdir)/examples \
	    $(DESTDIR)$(bashcompdir) $(DESTDIR)$(sysconfdir)/krun $(DESTDIR)$(systemdunitdir) \
	    $(DESTDIR)$(systemdgeneratordir) $(DESTDIR)$(sysusersdir)
	$(INSTALL_PROGRAM) $(BINDIR)/kpack $(BINDIR)/krun $(DESTDIR)$(bindir)/
	for p in kpack krun; do $(MAN_SUBST) man/$$p.1 > $(DESTDIR)$(man1dir)/$$p.1 && chmod 644 $(DESTDIR)$(man1dir)/$$p.1; done
	$(INSTALL_DATA) completions/kpack $(DESTDIR)$(bashcompdir)/kpack
	ln -sf kpack $(DESTDIR)$(bashcompdir)/krun
	$(INSTALL_DATA) README.md LICENSE $(DESTDIR)$(docdir)/
	$(INSTALL_DATA) $(filter docs/%,$(INSTALL_DOCS)) $(DESTDIR)$(docdir)/docs/
	$(INSTALL_DATA) systemd/krun-serve.conf $(DESTDIR)$(docdir)/examples/krun-serve.conf
	$(INSTALL_SUBST) systemd/krun-serve@.service.in > $(DESTDIR)$(systemdunitdir)/krun-serve@.service
	chmod 644 $(DESTDIR)$(systemdunitdir)/krun-serve@.service
	$(INSTALL_SUBST) systemd/krun-serve-generator.in > $(DESTDIR)$(systemdgeneratordir)/krun-serve-generator
	chmod 755 $(DESTDIR)$(systemdgeneratordir)/krun-serve-generator
	$(INSTALL_DATA) systemd/krun.sysusers $(DESTDIR)$(sysusersdir)/krun.conf

install-strip:
	$(MAKE) INSTALL_PROGRAM='$(INSTALL_PROGRAM) -s' install

# Removes what install wrote, and the directories it made when they are left empty; never a
# configuration file an operator wrote in $(sysconfdir)/krun.
uninstall:
	rm -f $(DESTDIR)$(bindir)/kpack $(DESTDIR)$(bindir)/krun $(DESTDIR)$(man1dir)/kpack.1 $(DESTDIR)$(man1dir)/krun.1 \
	    $(DESTDIR)$(bashcompdir)/kpack $(DESTDIR)$(bashcompdir)/krun \
	    $(addprefix $(DESTDIR)$(docdir)/,$(INSTALL_DOCS) examples/krun-serve.conf) \
	    $(DESTDIR)$(systemdunitdir)/krun-serve@.service $(DESTDIR)$(systemdgeneratordir)/krun-serve-generator \
	    $(DESTDIR)$(sysusersdir)/krun.conf
	rmdir $(DESTDIR)$(docdir)/docs $(DESTDIR)$(docdir)/examples $(DESTDIR)$(docdir) $(DESTDIR)$(sysconfdir)/krun 2>/dev/null || true

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
