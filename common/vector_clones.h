// PS_VECTOR_CLONES: compile a hot loop for plain x86-64 (SSE2) and AVX2,
// the dynamic loader picking the one the CPU runs (GCC's target_clones, an
// ifunc). PS_WIDE_VECTOR_CLONES adds AVX-512F, for loops whose cost is
// arithmetic (square roots, divisions: Adam, Adagrad, RMSProp, FTRL); the
// streaming ones (SGD, momentum, the NaN/Inf check) measured no faster
// from memory on 512-bit vectors (bench/apply_bench; docs/performance.md).
// The build stays portable and psd's per-element loops run on the widest
// vectors that pay.
// Results are bit-identical to the SSE2 build's: the same IEEE operations,
// only more of them at a time. AVX-512F has FMA instructions, so the project
// builds with -ffp-contract=off (meson.build): no clone fuses a * b + c.
#pragma once

// Not under ThreadSanitizer: a clone's resolver runs while the program is
// relocated, before TSan's runtime is up, and crashes there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define PS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#define PS_WIDE_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PS_VECTOR_CLONES
#define PS_WIDE_VECTOR_CLONES
#endif
