# ckpt — build, test, demo. `make help` lists the targets.
#
# Sources are found by wildcard: a new .c file in one of the subsystem folders
# (LIB_DIRS, SVC_DIRS; docs/ARCHITECTURE.md says which is which) joins the binary; a new tests/unit/<folder>/test_*.c becomes a cmocka
# test program. BUILD may be set to build in another folder (helpers and CI
# building side by side), SAN=1 builds with ASan+UBSan.

PREFIX  ?= /usr/local
# The release, as `ckpt --version` prints it (service/cli/main.c), for ckpt.pc;
# SOVERSION changes when libckpt.so's ABI (include/ckpt.h) breaks.
VERSION   := 0.1.0
SOVERSION := 0
DESTDIR ?=
BUILD   ?= build
SAN     ?= 0
CC      ?= cc

DEB_PACKAGES := build-essential pkg-config clang libclang-rt-14-dev \
	libsqlite3-dev libcurl4-openssl-dev libarchive-dev libopenblas-dev \
	libcmocka-dev libjansson-dev libpcre2-dev libmicrohttpd-dev libssl-dev \
	libzstd-dev zlib1g-dev zstd python3 python3-numpy python3-zarr python3-numcodecs \
	python3-torch curl ca-certificates chromium chromium-driver python3-selenium \
	ceph-mon ceph-osd radosgw ceph-common libexpat1-dev postgresql libpq-dev man-db zsh jq

# libcurl, libarchive, libmicrohttpd, OpenBLAS and libpq are headers only here: common/lazylib.h
# loads them on first use, so a `ckpt worker` exec does not pay for them.
PKGS    := sqlite3 libcurl libarchive expat libpq jansson libpcre2-8 libmicrohttpd libcrypto libzstd zlib
LINKED_PKGS := sqlite3 expat jansson libpcre2-8 libcrypto libzstd zlib
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(LINKED_PKGS) 2>/dev/null) -ldl -lpthread -lm

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
CSTD    := -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64
INCS    := -I. -I/usr/include/openblas
ifeq ($(SAN),1)
  # -O2, not -O1: the e2e scripts spend most of their CPU in ckpt's own work
  # under the sanitizers (test_roundtrip 57 -> 47, test_lora 50 -> 40 CPU-s in
  # one A/B whose first half ran beside another suite, so an upper bound of
  # the gain), with the same checks.
  # -g1 (line tables and functions, no variables): a sanitizer's report is
  # the same as with -g, file:line of every frame, inlined ones too (what
  # the symbolizer reads), and the build stage of `make test` compiles in
  # ~15-20% less CPU (ckpt from scratch: 85.7 -> 71.2 CPU-s). Debug by
  # hand with -g: make SAN=1 CFLAGS=-g.
  OPT   := -O2 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  # The sanitizer build's programs (ckpt, the test Hub, the unit tests) start
  # and exit thousands of times in `make test`, and LeakSanitizer scans the
  # runtime's data at every exit. One runtime linked in (the static libasan
  # holds UBSan's handlers too, so there is no second copy of the sanitizer
  # common data in libubsan.so to scan) and a fixed load address (no
  # relocation of the instrumented globals at every start) halve what a
  # process pays before and after its work. The shared library keeps the
  # dynamic runtime.
  SAN_EXE_LDFLAGS := -static-libasan -static-libubsan -no-pie
else
  OPT   := -O2 -g
endif
CFLAGS_ALL = $(CSTD) $(WARN) $(OPT) $(INCS) $(PKG_CFLAGS) $(CFLAGS)
LDFLAGS_ALL = $(OPT) $(LDFLAGS)
# Linking a program (not the shared library).
EXE_LDFLAGS = $(LDFLAGS_ALL) $(SAN_EXE_LDFLAGS)

# The folders in layer order, lowest first: a file may include headers of its
# own folder and of folders before it (make check-layers). include/ (the public
# ckpt.h, which needs nothing) is the bottom: common/error.h and format/dtype.h
# take its enums.
LIB_DIRS  := include common format plan lora transform state store fixtures hub
SVC_DIRS  := service/jobs service/http service/daemon service/cli
LIB_SRCS  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
SVC_SRCS  := $(foreach d,$(SVC_DIRS),$(wildcard $(d)/*.c))
# Unit tests mirror the tree: tests/unit/<folder>/test_*.c, each built into
# $(BUILD)/tests/test_* (names are unique across folders).
TEST_SRCS := $(wildcard tests/unit/*/test_*.c)
TEST_SUPPORT := $(wildcard tests/support/*.c)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)

SCHEMA_SQL := $(sort $(wildcard schema/[0-9]*.sql))
# The same numbered migrations in PostgreSQL's dialect (--db postgresql://).
SCHEMA_PG_SQL := $(sort $(wildcard schema/pg/[0-9]*.sql))
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/schema.o $(BUILD)/obj/gen/schema_pg.o
# The web dashboard's files, compiled in (service/http/dashboard/embed.sh).
DASH_FILES := service/http/dashboard/index.html service/http/dashboard/app.js service/http/dashboard/app.css
SVC_OBJS  := $(SVC_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/dashboard.o
# The service objects but the CLI's main(): what unit tests of service/ link.
SVC_LIB_OBJS := $(filter-out $(BUILD)/obj/service/cli/main.o,$(SVC_OBJS))
SUP_OBJS  := $(TEST_SUPPORT:%.c=$(BUILD)/obj/%.o)
TEST_BINS := $(addprefix $(BUILD)/tests/,$(notdir $(TEST_SRCS:.c=)))

.PHONY: FORCE all help deps deps-bench test unit header-check check-exports e2e demo bench bench-large fuzz fuzz-short install install-lib install-deploy clean format lib check-deps check-layers

all: $(BUILD)/ckpt

help:
	@echo "make deps     install the Debian packages the build and tests need (root)"
	@echo "make          build $(BUILD)/ckpt"
	@echo "make test     build with ASan+UBSan and run every test"
	@echo "make check-layers  check the folders' layer order and module cycles"
	@echo "make demo     generate a model and run the pipeline on it; KEEP=1 leaves its daemon running and prints the dashboard URL"
	@echo "make bench    the speed and memory table of bench/run.sh; BENCH=torch (or easydel, lora, ...) runs bench/torch.sh"
	@echo "make bench-large  bench/large.sh: every operation on the 16 GB Llama-3-8B shape and the 18,900-tensor MoE"
	@echo "make fuzz     run each libFuzzer harness for FUZZ_SECONDS (default 60)"
	@echo "make lib      build $(BUILD)-pic/libckpt.a and $(BUILD)/libckpt.so"
	@echo "make install-lib  install libckpt, its public header ckpt.h and ckpt.pc"
	@echo "make install  install to \$$DESTDIR\$$PREFIX"
	@echo "make install-deploy  only the systemd unit (ExecStart in \$$PREFIX/bin) and the shell completions"
	@echo "make format   clang-format every source file"

# Debian packages only the benches need, not make test: awscli for bench/s3.sh's
# `aws s3 cp` baseline. `make bench BENCH=s3` installs them (deps-bench).
BENCH_DEB_PACKAGES := awscli

# deb_install(PACKAGES, EXTRA_CHECK): install only what is missing of
# PACKAGES (EXTRA_CHECK: shell that adds to $$missing); as non-root, print the
# command instead. One dpkg-query for all of them (it reads dpkg's status
# file at each start: ~50 ms a package, one after another, at every make test).
define deb_install
	@installed=" $$(dpkg-query -W -f='$${Package} $${Status}\n' $(1) 2>/dev/null | \
	  sed -n 's/ install ok installed$$//p' | tr '\n' ' ')"; \
	missing=""; for p in $(1); do \
	  case "$$installed" in *" $$p "*) ;; *) missing="$$missing $$p" ;; esac; \
	done; \
	$(2) \
	if [ -z "$$missing" ]; then echo "deps: all packages present"; \
	elif [ "$$(id -u)" = 0 ]; then echo "deps: installing$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "deps: missing$$missing"; echo "run: sudo apt-get update && sudo apt-get install -y$$missing"; exit 1; fi
endef

deps:
	$(call deb_install,$(DEB_PACKAGES),command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm";)
	@$(MAKE) --no-print-directory $(NPM_HUB)

deps-bench:
	$(call deb_install,$(BENCH_DEB_PACKAGES),)

# The npm client the Hub tests drive (@huggingface/hub), installed by deps
# from the npm registry into build/npm, so no test downloads anything.
NPM_DIR := build/npm
NPM_HUB := $(NPM_DIR)/node_modules/@huggingface/hub/package.json
$(NPM_HUB):
	@mkdir -p $(NPM_DIR) && cd $(NPM_DIR) && echo "deps: npm install @huggingface/hub@2.17" && \
	  npm install --no-audit --no-fund --silent @huggingface/hub@2.17 >/dev/null

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/gen/schema.c: $(SCHEMA_SQL) schema/embed.sh
	@mkdir -p $(dir $@)
	sh schema/embed.sh $@ $(SCHEMA_SQL)

$(BUILD)/gen/schema_pg.c: $(SCHEMA_PG_SQL) schema/embed.sh
	@mkdir -p $(dir $@)
	sh schema/embed.sh --prefix ckpt_pg_schema $@ $(SCHEMA_PG_SQL)

$(BUILD)/obj/gen/schema.o $(BUILD)/obj/gen/schema_pg.o: $(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/gen/dashboard.c: $(DASH_FILES) service/http/dashboard/embed.sh
	@mkdir -p $(dir $@)
	sh service/http/dashboard/embed.sh $@ $(DASH_FILES)

$(BUILD)/obj/gen/dashboard.o: $(BUILD)/gen/dashboard.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/libckpt.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/ckpt: $(SVC_OBJS) $(BUILD)/libckpt.a
	$(CC) $(EXE_LDFLAGS) -o $@ $(SVC_OBJS) $(BUILD)/libckpt.a $(PKG_LIBS)

$(BUILD)/libckpt-svc.a: $(SVC_LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Every unit test links the libraries (never includes a .c file), so editing a
# source rebuilds the tests that use it.
define unit_test_rule
$(BUILD)/tests/$(notdir $(1:.c=)): $(1) $$(SUP_OBJS) $(BUILD)/libckpt-svc.a $(BUILD)/libckpt.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS_ALL) $$(SAN_EXE_LDFLAGS) $$(TEST_LDFLAGS) -o $$@ $$< $$(SUP_OBJS) $(BUILD)/libckpt-svc.a $(BUILD)/libckpt.a $$(PKG_LIBS) -lcmocka
endef
$(foreach t,$(TEST_SRCS),$(eval $(call unit_test_rule,$(t))))

# test_lora records the merge engine's GEMM calls: it wraps cblas_sgemm.
$(BUILD)/tests/test_lora: TEST_LDFLAGS := -Wl,--wrap=cblas_sgemm

# The library: one -fPIC build in $(BUILD)-pic gives both the static archive
# that install-lib installs (PIC objects link into PIE programs and into other
# shared libraries) and libckpt.so, whose exports are exactly ckpt.h's
# functions (include/libckpt.map; tests/header/check_exports.py checks both).
lib:
	@mkdir -p $(BUILD)
	$(MAKE) BUILD=$(BUILD)-pic CFLAGS="$(CFLAGS) -fPIC" $(BUILD)-pic/libckpt.a
	$(CC) -shared $(LDFLAGS_ALL) -o $(BUILD)/libckpt.so -Wl,-soname,libckpt.so.$(SOVERSION) \
	  -Wl,--version-script=include/libckpt.map \
	  -Wl,--whole-archive $(BUILD)-pic/libckpt.a -Wl,--no-whole-archive $(PKG_LIBS)

check-exports: lib
	python3 tests/header/check_exports.py include/ckpt.h include/libckpt.map $(BUILD)/libckpt.so

# The library's example program (training states), built from the public
# header alone: -Iinclude, not -I., so ckpt.h must stand on its own.
$(BUILD)/tests/state_example: tests/state_example.c include/ckpt.h $(BUILD)/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(OPT) $(SAN_EXE_LDFLAGS) -Iinclude $(CFLAGS) -o $@ $< $(BUILD)/libckpt.a $(PKG_LIBS)

# The public header on its own (tests/header/): strict C11 and C++ with
# -Iinclude only, linked against the library; in either order with the
# library's own headers; and the example program of its comment, cut out of
# the header by tests/header/example.sh, built and run. `make unit` runs them.
CXX ?= c++
HEADER_BINS := $(BUILD)/tests/header/standalone $(BUILD)/tests/header/standalone-cxx \
	$(BUILD)/tests/header/example
HEADER_OBJS := $(BUILD)/tests/header/order.o $(BUILD)/tests/header/order-first.o
$(BUILD)/tests/header/standalone: tests/header/standalone.c include/ckpt.h $(BUILD)/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -pedantic $(WARN) $(OPT) -Iinclude -o $@ $< $(BUILD)/libckpt.a $(PKG_LIBS)
$(BUILD)/tests/header/standalone-cxx: tests/header/standalone.cc include/ckpt.h $(BUILD)/libckpt.a
	@mkdir -p $(dir $@)
	$(CXX) -std=c++11 -pedantic -Wall -Wextra -Werror $(OPT) -Iinclude -o $@ $< $(BUILD)/libckpt.a $(PKG_LIBS)
$(BUILD)/tests/header/order.o: tests/header/order.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@
$(BUILD)/tests/header/order-first.o: tests/header/order.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DCKPT_H_FIRST -c $< -o $@
$(BUILD)/gen/ckpt_example.c: include/ckpt.h tests/header/example.sh
	@mkdir -p $(dir $@)
	sh tests/header/example.sh include/ckpt.h > $@.tmp && mv $@.tmp $@
$(BUILD)/tests/header/example: $(BUILD)/gen/ckpt_example.c $(BUILD)/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -pedantic $(WARN) $(OPT) -Iinclude -o $@ $< $(BUILD)/libckpt.a $(PKG_LIBS)

header-check: $(HEADER_BINS) $(HEADER_OBJS)
	@set -e; d=$$(mktemp -d "$${TMPDIR:-/tmp}/ckpt-header.XXXXXX"); trap 'rm -rf "$$d"' EXIT; \
	  echo "== header: standalone (C11), standalone-cxx (C++11), order, example"; \
	  $(BUILD)/tests/header/standalone; $(BUILD)/tests/header/standalone-cxx; \
	  $(BUILD)/tests/header/example "$$d/run/latest"; \
	  python3 tests/header/check_exports.py include/ckpt.h include/libckpt.map

# ckpt.pc for pkg-config: Libs links the shared library; a static link
# (pkg-config --static) adds what libckpt.a needs: the Debian libraries it
# links (Requires.private) and libdl, libpthread, libm.
# Written every time: it holds PREFIX, which may differ from the last run.
$(BUILD)/ckpt.pc: FORCE
	@mkdir -p $(dir $@)
	printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$${exec_prefix}/lib' \
	  'includedir=$${prefix}/include' '' 'Name: ckpt' \
	  'Description: training states (save_state / load_state) in safetensors: libckpt' \
	  'Version: $(VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lckpt' \
	  'Libs.private: -ldl -lpthread -lm' 'Requires.private: $(LINKED_PKGS)' > $@

install-lib: lib $(BUILD)/ckpt.pc
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 0644 $(BUILD)-pic/libckpt.a $(DESTDIR)$(PREFIX)/lib/libckpt.a
	install -m 0755 $(BUILD)/libckpt.so $(DESTDIR)$(PREFIX)/lib/libckpt.so.$(SOVERSION)
	ln -sf libckpt.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/libckpt.so
	install -m 0644 include/ckpt.h $(DESTDIR)$(PREFIX)/include/ckpt.h
	install -m 0644 $(BUILD)/ckpt.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/ckpt.pc

# The local Hub of the tests and the demo (tests/hub/testhub.c): the daemon's
# Hub read API (service/http/hub_api.c) and /v1/checkpoints (store_api.c),
# with faults injected on demand.
TESTHUB_OBJS := $(BUILD)/obj/service/http/hub_api.o $(BUILD)/obj/service/http/store_api.o \
	$(BUILD)/obj/service/http/http_util.o
$(BUILD)/ckpt-testhub: tests/hub/testhub.c $(TESTHUB_OBJS) $(BUILD)/libckpt.a
	$(CC) $(CFLAGS_ALL) $(SAN_EXE_LDFLAGS) -o $@ $< $(TESTHUB_OBJS) $(BUILD)/libckpt.a $(PKG_LIBS)

# test: sanitizer build in build/san, unit tests, end-to-end tests, a short
# fuzz run — every stage runs even when an earlier one failed; the last line
# is "N passed, N failed" (tests/run_all.sh).
test: deps
	@MAKE="$(MAKE)" FUZZ_SECONDS=6 CKPT_NPM_CACHE=$(abspath $(NPM_DIR)) tests/run_all.sh

# The folders' layer order and no cycle between modules (tests/check_layers.py).
check-layers: $(BUILD)/ckpt
	@python3 tests/check_layers.py $(BUILD)

unit: $(TEST_BINS) $(HEADER_BINS) $(HEADER_OBJS)
	@set -e; fail=0; for t in $(TEST_BINS); do \
	  echo "== $$t"; ASAN_OPTIONS=detect_leaks=1 $$t || fail=1; \
	done; $(MAKE) --no-print-directory header-check || fail=1; exit $$fail

e2e: $(BUILD)/ckpt $(BUILD)/tests/state_example $(BUILD)/ckpt-testhub $(NPM_HUB)
	@CKPT_NPM_CACHE=$(abspath $(NPM_DIR)) CKPT_BIN=$(abspath $(BUILD)/ckpt) CKPT_TESTHUB=$(abspath $(BUILD)/ckpt-testhub) tests/e2e/run.sh

FUZZ_SECONDS ?= 60
FUZZ_BUILD := build/fuzz
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
# -g1 as in the sanitizer build: a report still names file:line of every
# frame, and clang compiles ~15% less (the harnesses build in every make
# test); FUZZ_DEBUG=-g for a session in gdb.
FUZZ_DEBUG ?= -g1
FUZZ_CFLAGS := $(CSTD) $(FUZZ_DEBUG) -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $(INCS) $(PKG_CFLAGS)
# The harnesses exercise format/ (which uses only common/), so only those are
# compiled in: sources are listed, not taken by wildcard across the tree, and an
# unrelated half-written file elsewhere must not break the fuzz build. Each is
# compiled once into $(FUZZ_BUILD)/obj (instrumented for libFuzzer: the same
# flags as the harnesses) and linked into every harness. UB aborts so libFuzzer
# records it.
FUZZ_LIB_SRCS := $(wildcard common/*.c) format/dtype.c format/safetensors.c format/checkpoint.c format/zarr.c \
	format/pickle.c format/zipdir.c format/torch.c format/dcp.c format/nxd.c format/easydel_tree.c
FUZZ_LIB_OBJS := $(FUZZ_LIB_SRCS:%.c=$(FUZZ_BUILD)/obj/%.o)
$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB_OBJS)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -o $@ $< $(FUZZ_LIB_OBJS) $(PKG_LIBS)
# fuzz_rebuild runs the store's file rebuild (store/rebuild.c) and the
# executor's reads over it: those, and the plan algebra they use, join in.
FUZZ_REBUILD_OBJS := $(FUZZ_LIB_OBJS) $(addprefix $(FUZZ_BUILD)/obj/,store/rebuild.o plan/plan.o plan/executor.o)
$(FUZZ_BUILD)/fuzz_rebuild: tests/fuzz/fuzz_rebuild.c $(FUZZ_REBUILD_OBJS)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -o $@ $< $(FUZZ_REBUILD_OBJS) $(PKG_LIBS)

fuzz: deps $(FUZZ_BINS)
	@for f in $(FUZZ_BINS); do n=$$(basename $$f); mkdir -p $(FUZZ_BUILD)/corpus-$$n; \
	  echo "== $$n for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(FUZZ_BUILD)/corpus-$$n tests/fuzz/corpus/$$n || exit 1; done

fuzz-short:
	$(MAKE) fuzz FUZZ_SECONDS=10

demo: deps all $(BUILD)/ckpt-testhub
	@KEEP=$(KEEP) CKPT_BIN=$(abspath $(BUILD)/ckpt) CKPT_TESTHUB=$(abspath $(BUILD)/ckpt-testhub) ./demo.sh

# bench: the transform engine's table (bench/run.sh); BENCH=NAME runs
# bench/NAME.sh instead (torch, easydel, lora, store, fetch, queue, serve, s3).
BENCH ?= run
bench: all $(BUILD)/ckpt-testhub
	@[ -f bench/$(BENCH).sh ] || { echo "make bench: no bench/$(BENCH).sh"; exit 2; }
	@if [ "$(BENCH)" = s3 ]; then $(MAKE) --no-print-directory deps-bench; fi
	@CKPT_BIN=$(abspath $(BUILD)/ckpt) CKPT_TESTHUB=$(abspath $(BUILD)/ckpt-testhub) bench/$(BENCH).sh

# The full-size Llama-3-8B shape (16 GB, kept between runs) and the many-tensor MoE.
bench-large: all $(BUILD)/ckpt-testhub
	@CKPT_BIN=$(abspath $(BUILD)/ckpt) CKPT_TESTHUB=$(abspath $(BUILD)/ckpt-testhub) bench/large.sh

$(BUILD)/ckpt.1: $(BUILD)/ckpt deploy/mkman.sh
	sh deploy/mkman.sh $(BUILD)/ckpt $@

install: all $(BUILD)/ckpt.1 install-lib install-deploy
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0755 $(BUILD)/ckpt $(DESTDIR)$(PREFIX)/bin/ckpt
	install -m 0644 $(BUILD)/ckpt.1 $(DESTDIR)$(PREFIX)/share/man/man1/ckpt.1

# What install takes from deploy/ without building anything (test_http.sh runs
# it alone): the systemd unit, its ExecStart naming $(PREFIX)/bin/ckpt (the
# unit in deploy/ says /usr/local/bin, the default PREFIX), and the bash and
# zsh completions.
install-deploy:
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
	  $(DESTDIR)$(PREFIX)/share/zsh/site-functions
	sed 's|/usr/local/bin/|$(PREFIX)/bin/|g' deploy/systemd/ckpt.service >$(DESTDIR)$(PREFIX)/lib/systemd/system/ckpt.service
	chmod 0644 $(DESTDIR)$(PREFIX)/lib/systemd/system/ckpt.service
	install -m 0644 deploy/completion/ckpt.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/ckpt
	install -m 0644 deploy/completion/_ckpt $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_ckpt

FORCE:

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-*

-include $(shell find $(BUILD)/obj $(FUZZ_BUILD)/obj -name '*.d' 2>/dev/null) $(wildcard $(FUZZ_BUILD)/*.d)
