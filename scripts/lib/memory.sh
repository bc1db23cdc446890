# shellcheck shell=bash
# The page cache before a measured append run, as the bench scripts leave it: sourced by
# bench-compare, bench-probe and bench-profile.
#
# DROP_CACHES (1 where /proc/sys/vm/drop_caches is writable, that is as root; 0 otherwise):
# write back every dirty page, then drop the clean ones, so every append run writes into memory
# in the same state. On this project's VM the first ~5 GiB of new page-cache pages cost about
# 1.5 us each and every one after that about 10 us (the host backs the guest's memory lazily;
# `dd` of 4 KiB blocks shows it with no server running: docs/benchmarks.md, "Hardware").
# Without the drop a 4 KiB row measures which server ran after the other had used the cheap
# memory up. On a machine whose memory is all backed it changes nothing but the first read
# of each file's tail page. DROP_CACHES=0 keeps the page cache.
if [[ -w /proc/sys/vm/drop_caches ]]; then DROP_CACHES=${DROP_CACHES:-1}; else DROP_CACHES=0; fi

# settle_memory: `sync`, then (with DROP_CACHES=1) drop the clean page cache.
settle_memory() {
  sync
  if [[ $DROP_CACHES == 1 ]]; then echo 1 >/proc/sys/vm/drop_caches; fi
}
