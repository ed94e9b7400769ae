// PS_VECTOR_CLONES: compile a hot loop twice, for plain x86-64 (SSE2) and
// for AVX2, the dynamic loader picking the one the CPU runs (GCC's
// target_clones, an ifunc). The build stays portable and psd's per-element
// loops (optimizer updates, the NaN/Inf check) run on 256-bit vectors where
// the CPU has them (bench/apply_bench; docs/performance.md).
// Without FMA in the list, results are bit-identical to the SSE2 build's:
// the same IEEE operations, only more of them at a time.
#pragma once

// Not under ThreadSanitizer: a clone's resolver runs while the program is
// relocated, before TSan's runtime is up, and crashes there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define PS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PS_VECTOR_CLONES
#endif
