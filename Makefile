# polygw — one flat Makefile.
#
#   make            build/polygw, build/polygwctl, build/libpolygw.{a,so}
#   make deps       install missing Debian packages (apt-get, non-interactive)
#   make run        build and start the sidecar with deploy/polygw.yaml
#   make test       normal build with -Werror, then an ASan+UBSan build that
#                   runs every suite (tests/run-suites.sh: unit, integration,
#                   redis, clients, fuzz replay, docs and layout checks, clang
#                   fuzz build); the last line is "N passed, N failed"
#   make bench      benchmarks under tests/bench/ (not part of make test)
#   make install    PREFIX=/usr/local DESTDIR= (SBINDIR, LIBDIR: the daemon's and
#                   the library's directories, default PREFIX/bin and PREFIX/lib)
#   make deb        Debian packages in build/deb/ (debian/), checked by lintian
#   make compile_commands.json   $(BUILD)/compile_commands.json (needs bear)
#
# Variables: BUILD (output dir), SAN=1 (sanitizers), V=1 (full commands),
# WERROR=1 (warnings are errors; make test sets it),
# DEBUG_HOOKS=1 (test-only methods; the default when SAN=1),
# CFLAGS/LDFLAGS are the user's and are added to, never replaced.

BUILD   ?= build
SAN     ?= 0
PREFIX  ?= /usr/local
SBINDIR ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
DESTDIR ?=
VERSION := 0.1.0

CC      ?= cc
CFLAGS  ?= -O2 -g
PKG_CONFIG ?= pkg-config

ifeq ($(V),1)
Q :=
else
Q := @
endif

# libev and libhttp-parser ship no .pc file on Debian 12; every other library
# comes from pkg-config.
# The daemon links DAEMON_PKGS only; jansson is the client library's, the
# tools' and the tests' (tests/ref/ holds the jansson reference transcoder).
DAEMON_PKGS := msgpack yaml-0.1 libcurl hiredis openssl libsystemd libprotobuf-c zlib libxml-2.0
PKGS      := $(DAEMON_PKGS) jansson
PKG_CFLAGS = $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null) -lev -lhttp_parser -lm
DAEMON_LIBS = $(shell $(PKG_CONFIG) --libs $(DAEMON_PKGS) 2>/dev/null) -lev -lhttp_parser -lm
CHECK_LIBS = $(shell $(PKG_CONFIG) --libs check 2>/dev/null)

# Warnings are errors in `make test` and CI (WERROR=1, which they set), not
# for someone building a release with a newer compiler that warns more.
WERROR ?= 0
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wpointer-arith -Wformat=2 -Wno-format-nonliteral
ifeq ($(WERROR),1)
WARN += -Werror
endif
ALL_CFLAGS := -std=gnu11 -fPIC -D_GNU_SOURCE -DPGW_VERSION='"$(VERSION)"' \
              -I. -Ilib -Iproto -Isrc -Isidecar -Iclient/c $(WARN) $(PKG_CFLAGS) $(CFLAGS)
ALL_LDFLAGS := $(LDFLAGS)

# Test hooks (the debug.wedge method, docs/OPERATIONS.md): on in the
# sanitizer build the tests use, never in a release build.
DEBUG_HOOKS ?= $(SAN)
ifeq ($(DEBUG_HOOKS),1)
ALL_CFLAGS += -DPGW_DEBUG_HOOKS
endif

ifeq ($(SAN),1)
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
# PGW_CHECK_PACKING: every queued reply is parsed back (sidecar/rpc/conn.c).
ALL_CFLAGS  += $(SANFLAGS) -O1 -DPGW_CHECK_PACKING
ALL_LDFLAGS += $(SANFLAGS)
endif

# lib/ (buffer, list, UTF-8, JSON writer) depends on libc alone and is
# linked wherever proto/ is: the daemon, libpolygw, the tests and tools.
LIB_SRC     := $(wildcard lib/*.c)
PROTO_SRC   := $(wildcard proto/*.c) $(LIB_SRC)
CORE_SRC    := $(wildcard src/*.c)
SIDECAR_SRC := $(filter-out sidecar/main.c,$(wildcard sidecar/*.c sidecar/*/*.c))
CLIENT_SRC  := client/c/polygw.c
UNIT_SRC    := $(wildcard tests/unit/*.c)
REF_SRC     := $(wildcard tests/ref/*.c)
MOCK_SRC    := $(wildcard tests/mock_upstream/*.c)
BENCH_SRC   := $(wildcard tests/bench/*.c)
SHIM_SRC    := $(wildcard tests/shim/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

# The Redis scripts are compiled in (sidecar/backend/redis.c): one generated file
# defines rds_script_src[] and rds_script_name[] in enum rds_script order.
# Each entry is a whole script as EVAL takes it: the shared prelude
# (LUA_LIB) followed by the script (tests/redis/redis_support.py loads
# them the same way).
LUA_NAMES := admit release renew progress task budget
LUA_LIB   := sidecar/backend/lua/lib.lua
LUA_SRC   := $(LUA_NAMES:%=sidecar/backend/lua/%.lua)
LUA_GEN   := $(BUILD)/gen/lua_scripts.c
LUA_OBJ   := $(BUILD)/obj/gen/lua_scripts.o

# The status page (sidecar/http/status.c) is compiled in: one generated file
# holds sidecar/http/status.html as a byte array (od(1), no other tool).
STATUS_HTML     := sidecar/http/status.html
STATUS_HTML_GEN := $(BUILD)/gen/status_html.c
STATUS_HTML_OBJ := $(BUILD)/obj/gen/status_html.o

# The OTLP messages (sidecar/trace/otlp.c): protoc-c (protobuf-c-compiler)
# generates their C code from sidecar/trace/otlp.proto into $(BUILD)/gen/.
OTLP_PROTO := sidecar/trace/otlp.proto
OTLP_GEN_C := $(BUILD)/gen/otlp.pb-c.c
OTLP_GEN_H := $(BUILD)/gen/otlp.pb-c.h
OTLP_OBJ   := $(BUILD)/obj/gen/otlp.pb-c.o

PROTO_OBJ   := $(call obj,$(PROTO_SRC))
CORE_OBJ    := $(call obj,$(CORE_SRC))
SIDECAR_OBJ := $(call obj,$(SIDECAR_SRC)) $(LUA_OBJ) $(STATUS_HTML_OBJ) $(OTLP_OBJ)
CLIENT_OBJ  := $(call obj,$(CLIENT_SRC))
ALL_OBJ     := $(call obj,$(PROTO_SRC) $(CORE_SRC) $(SIDECAR_SRC) sidecar/main.c \
                 $(CLIENT_SRC) client/c/polygwctl.c $(UNIT_SRC) $(REF_SRC) $(MOCK_SRC) $(BENCH_SRC)) \
                 $(LUA_OBJ) $(OTLP_OBJ) \
                 $(STATUS_HTML_OBJ)

DAEMON     := $(BUILD)/polygw
CTL        := $(BUILD)/polygwctl
LIBA       := $(BUILD)/libpolygw.a
LIBSO      := $(BUILD)/libpolygw.so
UNIT       := $(BUILD)/unit_tests
MOCK       := $(BUILD)/mock_upstream
BENCH_BINS := $(patsubst tests/bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
SHIMS      := $(patsubst tests/shim/%.c,$(BUILD)/shim/%.so,$(SHIM_SRC))

.PHONY: all deps run test unit integration bench install clean check-deps fuzz fuzz-replay fuzz-build \
        check-docs check-layout format format-check fuzz-check-cc compile_commands.json deb
all: $(DAEMON) $(CTL) $(LIBA) $(LIBSO) $(MOCK) $(BENCH_BINS) $(SHIMS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

# Each line of LUA_LIB + the script becomes a C string literal (backslash,
# quote and ? escaped).
$(LUA_GEN): $(LUA_LIB) $(LUA_SRC)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN     $@")
	$(Q){ echo '/* Generated from sidecar/backend/lua/ by the Makefile: do not edit. */'; \
	  echo '#include "backend/redis.h"'; \
	  echo 'extern const char *const rds_script_src[RDS_N_SCRIPTS];'; \
	  echo 'extern const char *const rds_script_name[RDS_N_SCRIPTS];'; \
	  echo 'const char *const rds_script_src[RDS_N_SCRIPTS] = {'; \
	  for f in $(LUA_SRC); do \
	    sed -e 's/\\/\\\\/g' -e 's/["?]/\\&/g' -e 's/^/    "/' -e 's/$$/\\n"/' $(LUA_LIB) $$f || exit 1; echo '    ,'; \
	  done; \
	  echo '};'; \
	  echo 'const char *const rds_script_name[RDS_N_SCRIPTS] = {'; \
	  for n in $(LUA_NAMES); do echo "    \"$$n\","; done; \
	  echo '};'; } > $@.tmp && mv $@.tmp $@

$(LUA_OBJ): $(LUA_GEN)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(STATUS_HTML_GEN): $(STATUS_HTML)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN     $@")
	$(Q){ echo '/* Generated from $(STATUS_HTML) by the Makefile: do not edit. */'; \
	  echo '#include "http/status.h"'; \
	  echo 'const unsigned char status_html[] = {'; \
	  od -An -v -tx1 $< | sed -e 's/ *$$//' -e 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g' || exit 1; \
	  echo '};'; \
	  echo 'const size_t status_html_len = sizeof(status_html);'; } > $@.tmp && mv $@.tmp $@

$(STATUS_HTML_OBJ): $(STATUS_HTML_GEN)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(OTLP_GEN_H): $(OTLP_PROTO)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  PROTOC  $<")
	$(Q)protoc-c --c_out=$(BUILD)/gen -I$(dir $<) $<

$(OTLP_GEN_C): $(OTLP_GEN_H)

$(OTLP_OBJ): $(OTLP_GEN_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -I$(BUILD)/gen -MMD -MP -c $< -o $@

$(call obj,sidecar/trace/otlp.c tests/unit/test_trace.c): ALL_CFLAGS += -I$(BUILD)/gen
$(call obj,sidecar/trace/otlp.c tests/unit/test_trace.c): | $(OTLP_GEN_H)

$(DAEMON): $(call obj,sidecar/main.c) $(SIDECAR_OBJ) $(CORE_OBJ) $(PROTO_OBJ)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(DAEMON_LIBS)

# libpolygw exports only pgw_* (see client/c/libpolygw.map).
$(LIBA): $(CLIENT_OBJ) $(PROTO_OBJ)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBSO): $(CLIENT_OBJ) $(PROTO_OBJ) client/c/libpolygw.map
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared $(ALL_LDFLAGS) -Wl,--version-script=client/c/libpolygw.map \
	    -Wl,-soname,libpolygw.so.0 -o $@ $(CLIENT_OBJ) $(PROTO_OBJ) $(PKG_LIBS)

$(CTL): $(call obj,client/c/polygwctl.c) $(LIBA)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS)

$(UNIT): $(call obj,$(UNIT_SRC) $(REF_SRC)) $(SIDECAR_OBJ) $(CORE_OBJ) $(PROTO_OBJ) $(CLIENT_OBJ)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS) $(CHECK_LIBS)

$(MOCK): $(call obj,$(MOCK_SRC) $(LIB_SRC))
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS)

# Reached only through this pattern, the bench objects would be intermediate
# files, deleted (and echoed as `rm ...`) at the end of every build.
.SECONDARY: $(call obj,$(BENCH_SRC))
$(BUILD)/bench/%: $(BUILD)/obj/tests/bench/%.o $(LIBA) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS) -lpthread

# The metrics bench renders a real server's metrics: it links the sidecar.
$(BUILD)/bench/metrics: $(BUILD)/obj/tests/bench/metrics.o $(SIDECAR_OBJ) $(CORE_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS)

# The transcode bench compares the sidecar's two JSON -> msgpack transcoders
# (and yajl's parser, when libyajl-dev happens to be installed).
$(BUILD)/bench/transcode: $(call obj,tests/bench/transcode.c $(REF_SRC)) $(SIDECAR_OBJ) $(CORE_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS) $(shell pkg-config --libs yajl 2>/dev/null)

# LD_PRELOAD shims for tests (e.g. a getaddrinfo that hangs). Never
# sanitized: the ASan runtime must stay first in the library order.
$(BUILD)/shim/%.so: tests/shim/%.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  SHIM    $@")
	$(Q)$(CC) -std=gnu11 -D_GNU_SOURCE -fPIC -shared $(WARN) -O2 -g -o $@ $< -ldl -lpthread

# libFuzzer targets (tests/fuzz/fuzz_<name>.c). `make fuzz` builds each with
# clang into $(BUILD)/fuzz/<name> from clang objects of the library sources
# ($(BUILD)/fuzz/obj/, no gcc objects) and runs it in two passes: FUZZ_SECONDS
# over $(BUILD)/fuzz/corpus/<name> plus the committed tests/fuzz/corpus/<name>,
# then FUZZ_LARGE_SECONDS with length control off and inputs up to
# FUZZ_MAX_LEN bytes over $(BUILD)/fuzz/corpus-large/<name>, seeded with
# megabyte inputs by tests/fuzz/large_seeds.py (frames, replies and configs
# are that big in practice; libFuzzer alone grows inputs slowly).
# `make fuzz-build` only builds them and runs each over its committed corpus
# once (`make test` does that when clang is installed, so they cannot rot);
# `make fuzz-replay` replays the committed corpus through a gcc-built driver.
FUZZ_TARGETS := frame transcode sse retry_after config convert jscan json_msgpack_diff h1_answer \
                http_request h1_tls gemini evstream followup
FUZZ_SECONDS ?= 60
FUZZ_LARGE_SECONDS ?= $(FUZZ_SECONDS)
FUZZ_MAX_LEN ?= 4194304
FUZZ_CC      ?= clang
FUZZ_LIB_SRC := $(PROTO_SRC) $(CORE_SRC) sidecar/codec/transcode.c sidecar/core/config.c sidecar/core/models.c sidecar/core/modelmatch.c sidecar/core/tls.c sidecar/backend/redis_url.c sidecar/upstream/h1.c \
                sidecar/core/yamltree.c sidecar/core/name_index.c sidecar/codec/jscan.c \
                sidecar/codec/dialect.c sidecar/codec/convert.c sidecar/codec/converse.c \
                sidecar/http/httpreq.c sidecar/http/raw.c sidecar/backend/respids.c \
                sidecar/call/rawcall.c \
                sidecar/call/upath.c sidecar/http/gemroute.c sidecar/core/awscreds.c \
                sidecar/core/gcpcreds.c \
                $(REF_SRC)
FUZZ_OBJ     := $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(FUZZ_LIB_SRC))
# The HTTP/1.1 client's targets share their hooks (tests/fuzz/h1_contract.c).
FUZZ_H1      := h1_answer h1_tls
FUZZ_MAIN_OBJ := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/obj/tests/fuzz/fuzz_%.o) \
                 $(BUILD)/fuzz/obj/tests/fuzz/h1_contract.o
FUZZ_CFLAGS  := $(filter-out $(CFLAGS),$(ALL_CFLAGS)) -fsanitize=fuzzer-no-link,address,undefined \
                -g -O1 -fno-sanitize-recover=undefined
FUZZ_LDFLAGS := -fsanitize=fuzzer,address,undefined
FUZZ_BINS    := $(addprefix $(BUILD)/fuzz/,$(FUZZ_TARGETS))
FUZZ_REPLAY  := $(addprefix $(BUILD)/fuzz-replay/,$(FUZZ_TARGETS))
FUZZ_REPLAY_OBJ := $(call obj,tests/fuzz/replay_main.c tests/fuzz/h1_contract.c \
                   $(FUZZ_TARGETS:%=tests/fuzz/fuzz_%.c))
.SECONDARY: $(FUZZ_REPLAY_OBJ) $(FUZZ_MAIN_OBJ) $(FUZZ_OBJ)

$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZCC  $<")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/fuzz/%: $(BUILD)/fuzz/obj/tests/fuzz/fuzz_%.o $(FUZZ_OBJ)
	@$(if $(Q),echo "  FUZZLD  $@")
	$(Q)$(FUZZ_CC) $(FUZZ_LDFLAGS) -o $@ $^ $(PKG_LIBS)
$(FUZZ_H1:%=$(BUILD)/fuzz/%): $(BUILD)/fuzz/obj/tests/fuzz/h1_contract.o

$(BUILD)/fuzz-replay/%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(BUILD)/obj/tests/fuzz/replay_main.o \
                        $(call obj,$(REF_SRC)) $(SIDECAR_OBJ) $(CORE_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS)
$(FUZZ_H1:%=$(BUILD)/fuzz-replay/%): $(call obj,tests/fuzz/h1_contract.c)

fuzz: fuzz-check-cc
	$(Q)$(MAKE) --no-print-directory $(FUZZ_BINS)
	@mkdir -p $(FUZZ_TARGETS:%=$(BUILD)/fuzz/corpus/%) $(BUILD)/fuzz/artifacts
	@cp proto/vectors/*.msgpack $(BUILD)/fuzz/corpus/frame/
	@cp proto/vectors/*.msgpack $(BUILD)/fuzz/corpus/transcode/
	@cp deploy/polygw.yaml $(BUILD)/fuzz/corpus/config/
	@printf '{"model":"m","messages":[{"role":"user","content":"hi\\u00e9"}],"t":0.5,"n":-3}' \
	    > $(BUILD)/fuzz/corpus/transcode/inline-json
	@printf '\000: c\r\nevent: e\ndata: {"a":1}\ndata\rid: 7\nretry: 100\n\ndata: [DONE]\n\n' \
	    > $(BUILD)/fuzz/corpus/sse/inline-sse
	@printf '120' > $(BUILD)/fuzz/corpus/retry_after/inline-delta
	@printf 'Sunday, 06-Nov-94 08:49:37 GMT' > $(BUILD)/fuzz/corpus/retry_after/inline-rfc850
	@/usr/bin/python3 tests/fuzz/large_seeds.py $(BUILD)/fuzz/corpus-large $(FUZZ_MAX_LEN)
	@failed=; for t in $(FUZZ_TARGETS); do \
	    echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	    $(BUILD)/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -detect_leaks=1 -print_final_stats=1 \
	        -artifact_prefix=$(BUILD)/fuzz/artifacts/$$t- \
	        $(BUILD)/fuzz/corpus/$$t tests/fuzz/corpus/$$t || failed="$$failed $$t"; \
	    echo "== fuzz $$t, large inputs up to $(FUZZ_MAX_LEN) bytes ($(FUZZ_LARGE_SECONDS) s)"; \
	    $(BUILD)/fuzz/$$t -max_total_time=$(FUZZ_LARGE_SECONDS) -len_control=0 \
	        -max_len=$(FUZZ_MAX_LEN) -timeout=60 -rss_limit_mb=4096 -detect_leaks=1 \
	        -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/artifacts/$$t-large- \
	        $(BUILD)/fuzz/corpus-large/$$t $(BUILD)/fuzz/corpus/$$t tests/fuzz/corpus/$$t \
	        || failed="$$failed $$t(large)"; \
	done; [ -z "$$failed" ] || { echo "fuzz: crashes in:$$failed (see $(BUILD)/fuzz/artifacts)"; exit 1; }

# Never installs anything (that is `make deps`): says what is missing.
fuzz-check-cc:
	@command -v $(FUZZ_CC) >/dev/null 2>&1 || { \
	    echo "fuzz: $(FUZZ_CC) not found: install clang and libclang-rt-14-dev" \
	         "(Debian: apt-get install clang libclang-rt-14-dev, or run make deps)" >&2; exit 1; }

# Builds every target and runs each once over its committed corpus: proves
# they link and start, in seconds. Ends with "N passed, N failed" (targets).
fuzz-build: fuzz-check-cc
	$(Q)$(MAKE) --no-print-directory $(FUZZ_BINS)
	@pass=0; fail=0; for t in $(FUZZ_TARGETS); do \
	    if $(BUILD)/fuzz/$$t -runs=0 tests/fuzz/corpus/$$t > $(BUILD)/fuzz/$$t.smoke.log 2>&1; then \
	        pass=$$((pass + 1)); printf '  FUZZOK  %s\n' $$t; \
	    else fail=$$((fail + 1)); printf '  FUZZBAD %s (see %s)\n' $$t $(BUILD)/fuzz/$$t.smoke.log; fi; \
	done; echo "fuzz targets: $$pass passed, $$fail failed"; [ $$fail -eq 0 ]

# Every target over its committed corpus, going on after a failure; the
# last line counts inputs replayed cleanly and targets that failed.
fuzz-replay: $(FUZZ_REPLAY)
	@pass=0; fail=0; for t in $(FUZZ_TARGETS); do \
	    printf '  REPLAY  %-12s ' $$t; \
	    if out=$$(ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	              $(BUILD)/fuzz-replay/$$t tests/fuzz/corpus/$$t/* 2>&1); then \
	        echo "$$out"; n=$$(echo "$$out" | sed -n 's/^replayed \([0-9]*\) input.*/\1/p'); \
	        pass=$$((pass + $${n:-0})); \
	    else echo "FAILED"; echo "$$out"; fail=$$((fail + 1)); fi; \
	done; echo "fuzz replay: $$pass passed, $$fail failed"; [ $$fail -eq 0 ]

# ---------------------------------------------------------------------------
# Set-up, run, test

deps:
	@sh tests/deps.sh

run: deps
	$(Q)$(MAKE) --no-print-directory all
	@sh deploy/run-demo.sh $(BUILD)

unit: $(UNIT)
	$(UNIT)

integration: all
	POLYGW_BUILD=$(CURDIR)/$(BUILD) /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration

# The suites themselves (their list is in tests/run-suites.sh) run one after
# another, past failures, and end on one "N passed, N failed" line. Every
# build below it, the fuzz ones in run-suites.sh too, has -Werror.
# Its builds use every core (TEST_JOBS, default nproc).
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
test: export WERROR := 1
test: deps
	$(Q)$(MAKE) --no-print-directory -j$(TEST_JOBS) all
	$(Q)$(MAKE) --no-print-directory -j$(TEST_JOBS) BUILD=build/asan SAN=1 all $(notdir $(UNIT))
	@sh tests/run-suites.sh

unit_tests: $(UNIT)

# Every section reference (docs/DESIGN.md §3.1, PROTOCOL §4.4, …) and relative
# Markdown link points at something that exists.
check-docs:
	/usr/bin/python3 tests/check_docs.py

# The daemon's folders use only the folders under them (docs/DESIGN.md §2):
# their includes, and the calls between the objects of both builds that
# `make test` makes (build it first: `make all` and the ASan build).
check-layout:
	/usr/bin/python3 tests/check_layout.py --objects build/obj --objects build/asan/obj

# clang-format (Debian's clang-format package) with the committed
# .clang-format, over every tracked C file.
FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
CLANG_FORMAT ?= clang-format
format:
	$(CLANG_FORMAT) -i $(FORMAT_SRC)
format-check:
	$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SRC) && echo "format-check: $(words $(FORMAT_SRC)) files formatted"

bench: deps
	$(Q)$(MAKE) --no-print-directory all
	sh tests/bench/run.sh $(BUILD)
	@echo "## Admission cost (src/gov.c, ns per decision, best of 5)"
	$(BUILD)/bench/admission
	@echo "## Metrics: observation and rendering cost (sidecar/metrics/metrics.c, best of 5)"
	$(BUILD)/bench/metrics
	@echo "## Config load time against its size"
	/usr/bin/python3 tests/bench/config_load.py $(BUILD)
	@echo "## Fair queueing between apps"
	/usr/bin/python3 tests/bench/apps_fairness.py $(BUILD) 200 20
	@echo "## JSON -> msgpack: single pass vs jansson (ns per input byte, best of 7)"
	$(BUILD)/bench/transcode
	@echo "## AWS event-stream decoding vs its CRC floor and the SSE parser (best of 5)"
	$(BUILD)/bench/evstream
	@echo "## Response cache: sidecar CPU per hit vs per call upstream (one run)"
	/usr/bin/python3 tests/bench/cache_cpu.py $(BUILD) 5000
	@echo "## Redis Cluster: admissions over 3 primaries vs one (script time per primary)"
	/usr/bin/python3 tests/bench/cluster_admit.py --n 20000

# For editors and clangd: every compile command of `all` and the unit
# tests, recorded by bear(1) (Debian package bear) from a full rebuild
# into $(BUILD)/cdb, written to $(BUILD)/compile_commands.json.
compile_commands.json:
	@command -v bear >/dev/null 2>&1 || { \
	    echo "compile_commands.json: needs bear (Debian: apt-get install bear)" >&2; exit 1; }
	$(Q)bear --output $(BUILD)/compile_commands.json -- \
	    $(MAKE) --no-print-directory -B BUILD=$(BUILD)/cdb all $(notdir $(UNIT))
	@echo "  wrote $(BUILD)/compile_commands.json"

install: $(DAEMON) $(CTL) $(LIBA) $(LIBSO)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
	    $(DESTDIR)$(PREFIX)/include/polygw $(DESTDIR)$(PREFIX)/share/man/man8 \
	    $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 $(DAEMON) $(DESTDIR)$(SBINDIR)/
	install -m 755 $(CTL) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIBA) $(DESTDIR)$(LIBDIR)/
	install -m 644 $(LIBSO) $(DESTDIR)$(LIBDIR)/libpolygw.so.0
	ln -sf libpolygw.so.0 $(DESTDIR)$(LIBDIR)/libpolygw.so
	install -m 644 client/c/polygw.h proto/codes.h $(DESTDIR)$(PREFIX)/include/polygw/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    client/c/polygw.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/polygw.pc
	install -m 644 docs/polygw.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 644 docs/polygwctl.1 $(DESTDIR)$(PREFIX)/share/man/man1/

# Debian packages (debian/): polygw, libpolygw0 and libpolygw-dev, built by
# dpkg-buildpackage in a copy of the tree under $(BUILD)/deb (its results
# land next to that copy, not above the checkout), then checked by lintian.
# Needs the packages of `sh tests/deps.sh deb`.
DEB_DIR := $(BUILD)/deb
deb:
	@sh tests/deps.sh deb
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/polygw-$(VERSION)
	tar -cf - --exclude=./build --exclude=./.git --exclude=node_modules --exclude=__pycache__ \
	    --exclude=.pytest_cache . | tar -xf - -C $(DEB_DIR)/polygw-$(VERSION)
	cd $(DEB_DIR)/polygw-$(VERSION) && dpkg-buildpackage -us -uc -b -Jauto
	lintian --fail-on error,warning $(DEB_DIR)/*.changes | tee $(DEB_DIR)/lintian.txt
	@ls $(DEB_DIR)/*.deb

clean:
	rm -rf build

-include $(ALL_OBJ:.o=.d)
-include $(FUZZ_REPLAY_OBJ:.o=.d)
-include $(FUZZ_OBJ:.o=.d) $(FUZZ_MAIN_OBJ:.o=.d)
