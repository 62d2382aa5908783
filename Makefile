# Coffer: build, demo, test, bench. Needs a Swift 6 toolchain on PATH (swift.org; /opt/swift here).
PREFIX ?= /usr/local
DESTDIR ?=
# The toolchain on PATH, else the one this machine kind ships in /opt/swift.
SWIFT ?= $(shell command -v swift 2>/dev/null || echo /opt/swift/usr/bin/swift)
RUNTIME_DEBS = fuse3 libfuse3-dev libssl-dev libargon2-dev libsqlite3-dev libpq-dev liburing-dev pkg-config git
TEST_DEBS = attr rsync sqlite3 python3 util-linux procps systemd man-db postgresql openssl
BENCH_DEBS = gocryptfs fio python3 postgresql openssh-server sshfs
DEMO_DIR ?= /tmp/coffer-demo

.PHONY: all deps test-deps bench-deps build release demo test bench clean install uninstall man lint format

all: build

# Install the Debian packages that are missing (root; apt-get).
deps:
	@missing=""; for p in $(RUNTIME_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

test-deps: deps
	@missing=""; for p in $(TEST_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

bench-deps: deps
	@missing=""; for p in $(BENCH_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release

# Coffer's main job on a demo container: create it, mount it, leave it mounted for you to use.
demo: release
	@set -e; B=$$($(SWIFT) build -c release --show-bin-path)/coffer; \
	mkdir -p $(DEMO_DIR); \
	if mountpoint -q $(DEMO_DIR)/mnt; then $$B unmount $(DEMO_DIR)/mnt; fi; \
	rm -rf $(DEMO_DIR)/vault $(DEMO_DIR)/mnt; mkdir -p $(DEMO_DIR)/mnt; \
	printf 'demo-password\n' > $(DEMO_DIR)/passfile; chmod 600 $(DEMO_DIR)/passfile; \
	$$B init --passfile $(DEMO_DIR)/passfile --no-recovery-key $(DEMO_DIR)/vault; \
	$$B mount --passfile $(DEMO_DIR)/passfile $(DEMO_DIR)/vault $(DEMO_DIR)/mnt; \
	echo "Hello from Coffer" > $(DEMO_DIR)/mnt/hello.txt; mkdir -p $(DEMO_DIR)/mnt/docs; \
	sync $(DEMO_DIR)/mnt/hello.txt; \
	echo; $$B info --passfile $(DEMO_DIR)/passfile $(DEMO_DIR)/vault; echo; \
	echo "Mounted $(DEMO_DIR)/vault (encrypted) on $(DEMO_DIR)/mnt (plain view):"; ls -l $(DEMO_DIR)/mnt; \
	echo; echo "Use it with any tool, e.g.  cp -r ~/Documents $(DEMO_DIR)/mnt/docs/"; \
	echo "Unmount with:               $$B unmount $(DEMO_DIR)/mnt"; \
	echo "Mount again with:           $$B mount --passfile $(DEMO_DIR)/passfile $(DEMO_DIR)/vault $(DEMO_DIR)/mnt"

# Every test: unit tests of each layer and real-mount tests through the CLI.
test: test-deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build
	COFFER_TEST_ENGINE=postgres $(SWIFT) test --skip-build --filter CofferFSTests   # the filesystem tests again, over PostgreSQL
	# The mount suites again over PostgreSQL (fewer model seeds, crash rounds and fuzz seeds: the time budget of
	# `make test`), the tamper suites with psql as the attacker.
	COFFER_TEST_ENGINE=postgres COFFER_MODEL_SEEDS=$${COFFER_PG_MODEL_SEEDS:-10} COFFER_CRASH_ROUNDS=$${COFFER_PG_CRASH_ROUNDS:-10} \
		COFFER_FUZZ_SEED=$${COFFER_PG_FUZZ_SEEDS:-1-20} \
		$(SWIFT) test --skip-build --filter 'CofferCLITests\.(PosixTests|ModelTests|WorkloadTests|CrashTests|IntegrityTests|HostileContainerTests|DirectIOMountTests)'
	# The mount suites again with FUSE over io_uring offered by the kernel (the fuse module's enable_uring, put
	# back afterwards), on SQLite, the in-process mounts of CofferFUSETests (requestExit from a thread that blocks
	# signals), and the locks shared by PostgreSQL mounts (replies from another thread).
	@knob=/sys/module/fuse/parameters/enable_uring; if [ ! -w $$knob ]; then \
		echo "SKIPPED: the io_uring phase: $$knob is missing or not writable (kernel before 6.14, or not root)"; exit 0; fi; \
	before=$$(cat $$knob); echo Y > $$knob; trap 'echo '$$before' > '$$knob EXIT; \
	COFFER_MODEL_SEEDS=$${COFFER_URING_MODEL_SEEDS:-10} $(SWIFT) test --skip-build \
		--filter 'CofferFUSETests|CofferCLITests\.(IoUringMountTests|PosixTests|ModelTests|WorkloadTests|RandomReadMountTests|FallocateMountTests|DirectIOMountTests|MountTests)' && \
	COFFER_TEST_ENGINE=postgres $(SWIFT) test --skip-build --filter 'CofferCLITests\.SharedLocksTests'

# The code's layout, checked by the toolchain's swift-format with .swift-format (4 spaces, 150 columns,
# one statement per line); `make format` rewrites the tree to it.
lint:
	$(SWIFT) format lint --strict --recursive --parallel Sources Tests Package.swift

format:
	$(SWIFT) format format --in-place --recursive --parallel Sources Tests Package.swift

# Coffer, a plain directory and gocryptfs side by side (release build); then two mounts of one
# PostgreSQL container (bench/multi.sh: untar at once vs one after the other, write-to-read latency).
bench: release bench-deps
	bench/bench.sh $(BENCH_ARGS)
	bench/multi.sh $(BENCH_ARGS)

clean:
	rm -rf .build

# Installed files (DESTDIR and PREFIX honoured). BIN=path installs an existing binary instead of a
# release build (the tests install the debug build into a temporary DESTDIR).
BIN ?=
UNIT_DIR = $(PREFIX)/lib/systemd/user
DOC_DIR = $(PREFIX)/share/doc/coffer
INSTALLED = $(PREFIX)/bin/coffer $(UNIT_DIR)/coffer@.service $(DOC_DIR)/example.conf $(DOC_DIR)/systemd.md \
	$(PREFIX)/share/bash-completion/completions/coffer $(PREFIX)/share/zsh/site-functions/_coffer \
	$(PREFIX)/share/fish/vendor_completions.d/coffer.fish $(PREFIX)/share/man/man1/coffer.1

install:
	@set -e; bin="$(BIN)"; \
	if [ -z "$$bin" ]; then $(MAKE) release; bin=$$($(SWIFT) build -c release --show-bin-path)/coffer; fi; \
	install -D -m 755 "$$bin" "$(DESTDIR)$(PREFIX)/bin/coffer"; \
	install -d "$(DESTDIR)$(UNIT_DIR)"; \
	sed -e 's#/usr/local/bin/coffer#$(PREFIX)/bin/coffer#' -e 's#/usr/local/share/doc/coffer#$(DOC_DIR)#' Systemd/coffer@.service > "$(DESTDIR)$(UNIT_DIR)/coffer@.service"; \
	chmod 644 "$(DESTDIR)$(UNIT_DIR)/coffer@.service"; \
	install -D -m 644 Systemd/example.conf "$(DESTDIR)$(DOC_DIR)/example.conf"; \
	install -D -m 644 Systemd/README.md "$(DESTDIR)$(DOC_DIR)/systemd.md"; \
	install -d "$(DESTDIR)$(PREFIX)/share/bash-completion/completions" "$(DESTDIR)$(PREFIX)/share/zsh/site-functions" \
		"$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d"; \
	"$$bin" --generate-completion-script bash > "$(DESTDIR)$(PREFIX)/share/bash-completion/completions/coffer"; \
	"$$bin" --generate-completion-script zsh > "$(DESTDIR)$(PREFIX)/share/zsh/site-functions/_coffer"; \
	"$$bin" --generate-completion-script fish > "$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/coffer.fish"; \
	install -D -m 644 docs/coffer.1 "$(DESTDIR)$(PREFIX)/share/man/man1/coffer.1"; \
	for f in $(INSTALLED); do echo "installed $(DESTDIR)$$f"; done

uninstall:
	@for f in $(INSTALLED); do rm -f "$(DESTDIR)$$f" && echo "removed $(DESTDIR)$$f"; done; \
	rmdir "$(DESTDIR)$(DOC_DIR)" 2>/dev/null || true

# Regenerates docs/coffer.1 from the command's own help (swift-argument-parser's plugin; works offline).
man:
	$(SWIFT) package --allow-writing-to-package-directory generate-manual --configuration debug
	cp .build/plugins/GenerateManual/outputs/coffer/coffer.1 docs/coffer.1
