# Coffer: build, demo, test, bench. Needs a Swift 6 toolchain on PATH (swift.org; /opt/swift here).
PREFIX ?= /usr/local
DESTDIR ?=
# The toolchain on PATH, else the one this machine kind ships in /opt/swift.
SWIFT ?= $(shell command -v swift 2>/dev/null || echo /opt/swift/usr/bin/swift)
RUNTIME_DEBS = fuse3 libfuse3-dev libssl-dev libargon2-dev libsqlite3-dev pkg-config
TEST_DEBS = attr rsync sqlite3 git python3 util-linux
BENCH_DEBS = gocryptfs fio python3
DEMO_DIR ?= /tmp/coffer-demo

.PHONY: all deps test-deps bench-deps build release demo test bench clean

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

# Coffer, a plain directory and gocryptfs side by side (release build).
bench: release bench-deps
	bench/bench.sh $(BENCH_ARGS)

clean:
	rm -rf .build
