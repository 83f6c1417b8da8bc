// Pattern kernels for allocsim's real-GPU mode, compiled at run time with NVRTC by
// crates/cuda (include_str! of this file), so the binary needs no CUDA toolkit to build.
//
// Every live block is filled with a pattern derived from its allocation id and a generation
// number. The pattern is checked when the block is freed and at the end of the run: a block
// that another block overlaps, or that anything else wrote to, no longer holds its pattern.
// `touch_pattern` is the "live workload": it reads a block, checks it, and writes the next
// generation's pattern, as a layer that reads and updates a tensor does.
//
// A block is processed as 8-byte words counted from its start; the last word may be partial,
// and a block that is not 8-byte aligned is written byte by byte, so any size and alignment a
// policy produces is covered exactly, with no byte outside [base, base + nbytes) touched.
//
// Mismatches are counted into report[0]; the first one found (in launch order) also records
// report[1..5] = {allocation id, word index, expected word, found word}.

typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 mix64(u64 x) {
    // splitmix64's finaliser: every input bit affects every output bit.
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

__device__ __forceinline__ u64 pattern_word(u64 id, u32 generation, u64 word) {
    return mix64(mix64(id * 0x9e3779b97f4a7c15ULL + generation) ^ word);
}

__device__ __forceinline__ bool whole_word(const unsigned char* base, u64 nbytes, u64 offset) {
    return offset + 8 <= nbytes && (((u64)(base + offset)) & 7) == 0;
}

__device__ __forceinline__ void store_word(unsigned char* base, u64 nbytes, u64 word, u64 value) {
    u64 offset = word * 8;
    if (whole_word(base, nbytes, offset)) {
        *(u64*)(base + offset) = value;
    } else {
        for (u32 b = 0; b < 8 && offset + b < nbytes; b++) {
            base[offset + b] = (unsigned char)(value >> (8 * b));
        }
    }
}

// The word as stored; bytes past the block's end read as the expected value's bytes.
__device__ __forceinline__ u64 load_word(const unsigned char* base, u64 nbytes, u64 word, u64 expected) {
    u64 offset = word * 8;
    if (whole_word(base, nbytes, offset)) {
        return *(const u64*)(base + offset);
    }
    u64 value = expected;
    for (u32 b = 0; b < 8 && offset + b < nbytes; b++) {
        value &= ~(0xffULL << (8 * b));
        value |= ((u64)base[offset + b]) << (8 * b);
    }
    return value;
}

__device__ __forceinline__ void record_mismatch(u64* report, u64 id, u64 word, u64 expected, u64 found) {
    u64 earlier = atomicAdd(&report[0], 1ULL);
    if (earlier == 0) {
        report[1] = id;
        report[2] = word;
        report[3] = expected;
        report[4] = found;
    }
}

#define FOR_EACH_WORD(nbytes, w) \
    for (u64 w = blockIdx.x * (u64)blockDim.x + threadIdx.x, nwords_ = ((nbytes) + 7) / 8; \
         w < nwords_; w += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void fill_pattern(unsigned char* base, u64 nbytes, u64 id, u32 generation) {
    FOR_EACH_WORD(nbytes, w) {
        store_word(base, nbytes, w, pattern_word(id, generation, w));
    }
}

extern "C" __global__ void verify_pattern(const unsigned char* base, u64 nbytes, u64 id, u32 generation,
                                          u64* report) {
    FOR_EACH_WORD(nbytes, w) {
        u64 expected = pattern_word(id, generation, w);
        u64 found = load_word(base, nbytes, w, expected);
        if (found != expected) {
            record_mismatch(report, id, w, expected, found);
        }
    }
}

// Read-modify-write: check generation `generation`, leave generation `generation + 1`.
extern "C" __global__ void touch_pattern(unsigned char* base, u64 nbytes, u64 id, u32 generation,
                                         u64* report) {
    FOR_EACH_WORD(nbytes, w) {
        u64 expected = pattern_word(id, generation, w);
        u64 found = load_word(base, nbytes, w, expected);
        if (found != expected) {
            record_mismatch(report, id, w, expected, found);
        }
        store_word(base, nbytes, w, pattern_word(id, generation + 1, w));
    }
}
