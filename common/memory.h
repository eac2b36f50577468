// Process-wide memory settings for the `huddle` processes (called first thing from main, before any
// thread exists; never from library code).
#pragma once

namespace huddle {

// glibc malloc tuned for a process whose traffic is a stream of message frames of at most 256 KiB
// (wire::kMaxChunkBytes plus a header) next to a few model-sized buffers:
//  - one arena for all threads: ZeroMQ's I/O threads allocate the frames they receive and the main
//    thread frees them; per-thread arenas grow a heap each and hand it back when it empties, so
//    every burst re-faults fresh pages;
//  - allocations above 2 MiB (models, updates, reassembled tensors) get their own mapping and go
//    back to the OS on free;
//  - up to 64 MiB of freed frames stay mapped for reuse rather than being trimmed and faulted in
//    again on the next message.
// Measured (bench/transport_bench, bench/coordinator_rss): CurveZMQ ingest of 40 MB updates 0.28
// -> 0.6 GB/s against a fixed 256 KiB mmap threshold, plaintext 0.9 -> 1.2 (8 clients) and
// 0.9 -> 2.4 GB/s (1 client); coordinator peak RSS with 100 clients and a 4 MB model 47 -> 51 MiB
// (glibc's defaults: 70 MiB).
void ConfigureMalloc();

}  // namespace huddle
