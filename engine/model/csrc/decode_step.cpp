// The lean forward's layers as one C++ call for every step of a Llama-family model on a CPU.
//
// Why: at a few rows a layer is four weight-bound matrix products and ~40 small tensor ops; from Python each of
// those ops costs a few microseconds of dispatch, about half of a 135M model's decode step on a CPU. Here the
// matrix products, SiLU*mul and long chunks' attention call the same ATen kernels the Python path calls (oneDNN
// prepacked, torch's int8/int4 weight-only, SDPA), and the small work between them (RMSNorm, rotary, the paged KV
// write, short chunks' attention over their pages, residual adds) is plain loops over float32, in the Python path's
// order of operations.
//
// Built at run time by engine/model/compiled_step.py (a C++ compiler, torch's headers); registered as the torch
// class studio.DecodeModel.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

using at::Tensor;

namespace {

// The contract with engine/model/compiled_step.py, defined here once: Python passes linear kinds by these names and
// builds the chunk table with these columns, and checks both against contract() when it loads the library.
enum Kind : int64_t { PACKED, DENSE, INT8, INT4, BLOCKS };
constexpr std::array<std::pair<const char*, Kind>, 5> KINDS = {
    {{"onednn_packed", PACKED}, {"dense", DENSE}, {"int8", INT8}, {"int4", INT4}, {"bf16_blocks", BLOCKS}}};
enum ChunkColumn : int64_t { FIRST_ROW, ROWS, START, CHUNK_COLUMNS };
constexpr std::array<const char*, CHUNK_COLUMNS> CHUNK_COLUMN_NAMES = {"first_row", "rows", "start"};
constexpr int64_t LOOP_ROWS = 16;  // longer chunks (prompts) attend through SDPA's blocked kernels

// "kinds:onednn_packed,dense,int8,int4,bf16_blocks;chunk_columns:first_row,rows,start"
std::string contract() {
  std::string text = "kinds:";
  for (size_t i = 0; i < KINDS.size(); ++i) text += (i ? "," : "") + std::string(KINDS[i].first);
  text += ";chunk_columns:";
  for (size_t i = 0; i < CHUNK_COLUMN_NAMES.size(); ++i) text += (i ? "," : "") + std::string(CHUNK_COLUMN_NAMES[i]);
  return text;
}

// body(begin, end) over [0, units) on torch's threads, each claiming the next few units from a shared counter until
// none are left. Why: at::parallel_for gives each thread a fixed half, so a thread the OS takes off its core for a
// moment (on two cores: the window's UI thread, the server's event loop, the engine's own Python) holds the other at
// the region's end; claimed in small runs, the thread still running takes the rest. Measured on one-row int4 and int8
// products over a layer's cold weights, both schedules alternated in one process: p90 3-6 % lower, mean 1-3 %, with
// or without a competing thread. Each unit is computed alone: the result does not depend on which thread took it.
template <class Body>
void parallel_claimed(int64_t units, const Body& body) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), units));
  const int64_t run = std::max<int64_t>(1, units / (threads * 16));  // 16 claims a thread: the counter costs nothing
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t begin = next.fetch_add(run); begin < units; begin = next.fetch_add(run)) {
      body(begin, std::min(units, begin + run));
    }
  });
}

Kind kind_named(const std::string& name) {
  const auto found = std::find_if(KINDS.begin(), KINDS.end(), [&](const auto& known) { return name == known.first; });
  TORCH_CHECK_VALUE(found != KINDS.end(), "unknown linear kind '", name, "'");
  return found->second;
}

// a [rows, width] float32 tensor with rows of `width` contiguous values (the loops index it as such)
void check_rows(const Tensor& t, const char* name, int64_t rows, int64_t width, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == rows && t.size(1) == width, name, " must be [", rows, ", ", width,
                    "], not ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", not ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU");
}

struct Linear {
  Kind kind = PACKED;
  Tensor a;      // the prepacked weight, the int8 weight, or the int4 packed weight
  Tensor b;      // int8 scales, int4 scales and zeros, or a prepacked weight's plain float32 rows [N, K] (or none)
  Tensor bias;   // float32, or undefined
  int64_t group = 0;
  int64_t in_features = 0, out_features = 0;
  int64_t kernel_rows = 0;  // rows the kernel computes: out_features, or more (int4 pads rows to torch's multiple)
  at::ScalarType input = at::kFloat;  // what the kernel multiplies: float32 or bfloat16 rows
  int64_t tiles_from = 0;  // int4/int8: steps of at least this many rows multiply bfloat16 tiles (0: never)
  int64_t block = 0;       // int4: torch's packing's rows per block here, and whether a block's halves share bytes
  bool split = false;
  // steps of these many rows multiply int8 activations (0: never): int4 and int8 weights with VNNI dot products,
  // from amx_from rows (0: never) with AMX tiles
  int64_t acts_from = 0, acts_to = 0, amx_from = 0;
  // float32 / bfloat16 weights (dense, or prepacked with their plain rows): steps of at most these many rows take
  // dense_claimed_mm (0: never)
  int64_t claimed_to = 0;
};

Tensor onednn_linear(const Tensor& x, const Tensor& packed) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, c10::string_view,
                                     c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  return op.call(x, packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), c10::string_view(""));
}


// ---- int4 and int8 weights multiplied as bfloat16 tiles, for steps of several rows ----
//
// Why: torch's int4 and int8 weight-only kernels cost the same per row however many rows share a weight (an
// 11008x2048 int4 weight: ~1 ms for 1 row, ~7 ms for 16), so 16 decoding chats paid 16 single-chat products. Here
// each weight is converted to bfloat16 once per step, a tile of 64 rows x TILE_K columns at a time (64 KiB, in
// cache), and multiplied for all the step's rows by torch's brgemm (oneDNN's small-matrix kernel: AMX where the CPU
// has it). int4: (code - 8) * scale + zero rounded to bfloat16 (as the prefill's tiles, and as close as the kernel,
// whose output is bfloat16); int8: the codes exactly, the row scale applied to the product. Sums are float32.

constexpr int64_t TILE_K = 512;

inline uint16_t bf16_bits(float v) {  // round to nearest even, as c10::BFloat16 does for finite values
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// GCC 12 warns that the _mm512_undefined_* values inside its own intrinsics "may be used uninitialized" (they are
// don't-care lanes by design); for these functions' intrinsics only
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// A full split block of 64 rows into brgemm's pairs of columns ([kc / 2][64][2]), for CPUs with bfloat16
// conversion. Byte j of a column holds rows j (low nibble) and j + 32 (high). The two columns' codes are interleaved as
// bytes before they are widened, so each vector of 16 floats already holds 8 rows' pairs and rounding two of them to
// bfloat16 leaves 16 rows in brgemm's order: no permutation per store, and code - 8 taken on 32 bytes at once (about
// a third fewer vector operations than unpack_int4_unit's general path; the values are the same, bit for bit).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define STUDIO_INT4_PAIRS64 1
void unpack_int4_pairs64(const uint8_t* src, const c10::BFloat16* sz, int64_t padded, int64_t row0, int64_t k0,
                         int64_t kc, uint16_t* out) {
  const __m256i nibble = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const __m512i duplicate = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  // the byte unpacks work within 128-bit lanes: vector v of a column pair holds rows BASE[v]..BASE[v] + 7
  constexpr int BASE[8] = {0, 16, 8, 24, 32, 48, 40, 56};
  alignas(64) int8_t bytes[4][32];
  for (int64_t g = k0 / 32; g < (k0 + kc) / 32; ++g) {
    __m512 scale[8], zero[8];
    for (int v = 0; v < 8; ++v) {  // rows BASE[v]..+7: each row's [scale, zero] twice, as two float vectors
      const auto* words = reinterpret_cast<const __m256i*>(sz + (g * padded + row0 + BASE[v]) * 2);
      const __m512i both = _mm512_permutexvar_epi32(duplicate, _mm512_castsi256_si512(_mm256_loadu_si256(words)));
      scale[v] = _mm512_castsi512_ps(_mm512_slli_epi32(both, 16));
      zero[v] = _mm512_castsi512_ps(_mm512_and_si512(both, high_half));
    }
    for (int64_t k = g * 32; k < g * 32 + 32; k += 2) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k * 32));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (k + 1) * 32));
      // code - 8 as signed bytes, rows 0..31 (low nibbles) and 32..63 (high), the two columns interleaved
      const __m256i a_low = _mm256_sub_epi8(_mm256_and_si256(a, nibble), eight);
      const __m256i b_low = _mm256_sub_epi8(_mm256_and_si256(b, nibble), eight);
      const __m256i a_high = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(a, 4), nibble), eight);
      const __m256i b_high = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(b, 4), nibble), eight);
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes[0]), _mm256_unpacklo_epi8(a_low, b_low));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes[1]), _mm256_unpackhi_epi8(a_low, b_low));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes[2]), _mm256_unpacklo_epi8(a_high, b_high));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes[3]), _mm256_unpackhi_epi8(a_high, b_high));
      uint16_t* dst = out + (k - k0) * 64;
      for (int h = 0; h < 2; ++h) {  // rows 0..31, then 32..63
        __m512 f[4];  // rows +0..7, +16..23, +8..15, +24..31
        for (int p = 0; p < 4; ++p) {
          const int v = 4 * h + p;
          const auto* part = reinterpret_cast<const __m128i*>(bytes[2 * h + p / 2] + 16 * (p % 2));
          // (code - 8) * scale is exact in float32, so the fused multiply-add rounds once, as mul-then-add does
          f[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(part))), scale[v], zero[v]);
        }
        _mm512_storeu_si512(dst + 2 * (32 * h), reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f[2], f[0])));
        _mm512_storeu_si512(dst + 2 * (32 * h + 16), reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f[3], f[1])));
      }
    }
  }
}
#endif

// Columns [k0, k0 + kc) of the `count` rows of one packing unit starting at row `row0` (bytes from `src`), as brgemm's
// B: pairs of columns per row ([kc / 2][count][2]) when `vnni`, else rows of columns ([kc][count]).
void unpack_int4_unit(const uint8_t* src, int64_t count, bool pairs, const c10::BFloat16* sz, int64_t padded,
                      int64_t row0, int64_t k0, int64_t kc, uint16_t* out, bool vnni) {
  const int64_t half = count / 2;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if (count == 64 && !pairs) {  // a full block of 64 rows whose byte j holds rows j and j + 32: 16 rows at a time
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t g = k0 / 32; g < (k0 + kc) / 32; ++g) {
      __m512 scale[4], zero[4];
      for (int q = 0; q < 4; ++q) {  // rows 16q..16q+15: their [scale, zero] bfloat16 pairs as two float vectors
        const __m512i both = _mm512_loadu_si512(sz + (g * padded + row0 + 16 * q) * 2);
        scale[q] = _mm512_castsi512_ps(_mm512_slli_epi32(both, 16));
        zero[q] = _mm512_castsi512_ps(_mm512_and_si512(both, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
      }
      for (int64_t k = g * 32; k < g * 32 + 32; k += 2) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k * half));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (k + 1) * half));
        const __m256i codes[4] = {_mm256_and_si256(a, nibble), _mm256_and_si256(_mm256_srli_epi16(a, 4), nibble),
                                  _mm256_and_si256(b, nibble), _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble)};
        for (int q = 0; q < 4; ++q) {  // rows 16q..: low nibbles for q < 2, high ones for q >= 2
          const int high = q >> 1;
          const __m128i ca = (q & 1) ? _mm256_extracti128_si256(codes[high], 1) : _mm256_castsi256_si128(codes[high]);
          const __m128i cb =
              (q & 1) ? _mm256_extracti128_si256(codes[2 + high], 1) : _mm256_castsi256_si128(codes[2 + high]);
          // (code - 8) * scale is exact in float32, so the fused multiply-add rounds once, as mul-then-add does
          const __m512 fa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(ca), eight)),
                                            scale[q], zero[q]);
          const __m512 fb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(cb), eight)),
                                            scale[q], zero[q]);
#if defined(__AVX512BF16__)
          const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(fb, fa));  // a's 16, then b's (RNE)
#else
          auto round = [](__m512 v) {  // to bfloat16 bits, nearest even, in 16-bit lanes
            const __m512i bits = _mm512_castps_si512(v);
            const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
            return _mm512_cvtepi32_epi16(
                _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb), 16));
          };
          const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(round(fa)), round(fb), 1);  // a's, b's
#endif
          const int64_t row = 16 * q;
          if (vnni) {
            _mm512_storeu_si512(out + (k - k0) * count + 2 * row, _mm512_permutexvar_epi16(interleave, both));
          } else {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (k - k0) * count + row), _mm512_castsi512_si256(both));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (k + 1 - k0) * count + row),
                                _mm512_extracti64x4_epi64(both, 1));
          }
        }
      }
    }
    return;
  }
#endif
  for (int64_t k = k0; k < k0 + kc; ++k) {
    const uint8_t* column = src + k * half;
    const int64_t g = k / 32;
    for (int64_t j = 0; j < half; ++j) {
      const int64_t rows[2] = {pairs ? 2 * j : j, pairs ? 2 * j + 1 : j + half};
      const int codes[2] = {column[j] & 15, column[j] >> 4};
      for (int h = 0; h < 2; ++h) {
        const int64_t r = rows[h];
        const float v = static_cast<float>(codes[h] - 8) * static_cast<float>(sz[(g * padded + row0 + r) * 2]) +
                        static_cast<float>(sz[(g * padded + row0 + r) * 2 + 1]);
        out[vnni ? ((k - k0) / 2 * count + r) * 2 + (k - k0) % 2 : (k - k0) * count + r] = bf16_bits(v);
      }
    }
  }
}

bool tiles_vnni() {  // asked on every tiled product: the CPU's answer, once
  static const bool vnni = at::native::cpublas::could_pack(at::kBFloat16);
  return vnni;
}

// torch's int4 packing of a weight with rows of k inputs, in blocks of `block` rows: [padded rows, k / 2] bytes,
// scales and zeros beside it
void check_int4_packing(const Tensor& packed, const Tensor& sz, int64_t k, int64_t block) {
  TORCH_CHECK_VALUE(block == 32 || block == 64, "packing blocks are 32 or 64 rows, not ", block);
  const int64_t padded = packed.size(0);
  TORCH_CHECK_VALUE(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                        packed.size(1) * 2 == k && k % 32 == 0 && padded % 16 == 0,
                    "a packed int4 weight [rows, K / 2] for rows of ", k, ", not ", packed.sizes());
  TORCH_CHECK_VALUE(sz.dim() == 3 && sz.size(0) == k / 32 && sz.size(1) == padded && sz.size(2) == 2 &&
                        sz.scalar_type() == at::kBFloat16 && sz.is_contiguous(),
                    "scales and zeros must be a contiguous bfloat16 [K / 32, rows, 2] tensor, not ", sz.sizes());
}

// x [M, K] bfloat16 @ the int4 weight (torch's packing: blocks of `block` rows, halves sharing bytes when `split`)
// -> float32 [M, padded rows]
Tensor int4_tiles_mm(const Tensor& x, const Tensor& packed, const Tensor& sz, int64_t block, bool split, bool vnni) {
  TORCH_CHECK_VALUE(!vnni || tiles_vnni(), "this CPU's brgemm takes no pairs of bfloat16 columns");
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int4 tiles multiply bfloat16 rows [M, K]");
  const int64_t m = x.size(0), k = x.size(1), padded = packed.size(0);
  check_int4_packing(packed, sz, k, block);
  const Tensor rows = x.contiguous();
  Tensor out = at::empty({m, padded}, x.options().dtype(at::kFloat));
  const auto* a = rows.data_ptr<at::BFloat16>();
  const uint8_t* weights = packed.data_ptr<uint8_t>();
  const auto* scales = sz.data_ptr<c10::BFloat16>();
  float* o = out.data_ptr<float>();
  const int64_t full = padded / block * block, units = (padded + block - 1) / block;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> tile(TILE_K * block);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t first = unit * block, count = std::min(block, padded - first);
      const bool pairs = !(split && count == block && first < full);
      for (int64_t k0 = 0; k0 < k; k0 += TILE_K) {
        const int64_t kc = std::min(TILE_K, k - k0);
#if defined(STUDIO_INT4_PAIRS64)
        if (vnni && count == 64 && !pairs) {
          unpack_int4_pairs64(weights + first * (k / 2), scales, padded, first, k0, kc, tile.data());
        } else {
          unpack_int4_unit(weights + first * (k / 2), count, pairs, scales, padded, first, k0, kc, tile.data(), vnni);
        }
#else
        unpack_int4_unit(weights + first * (k / 2), count, pairs, scales, padded, first, k0, kc, tile.data(), vnni);
#endif
        at::native::cpublas::brgemm(m, count, kc, k, count, padded, k0 > 0, a + k0,
                                    reinterpret_cast<const at::BFloat16*>(tile.data()), o + first, vnni);
      }
    }
    at::native::cpublas::brgemm_release(vnni);
  });
  return out;
}

// int8 codes -> their bfloat16, exactly (|code| <= 127: its float's low 16 bits are zero). Where the CPU converts to
// bfloat16 itself, 32 codes take one conversion instead of the shift and narrowing the compiler makes of the scalar
// loop: the int8 tiles' whole product at 16 rows went from 2.7 ms to 1.75 ms on a 2048x11008 weight.
void int8_to_bf16(const int8_t* src, uint16_t* dst, int64_t count) {
  int64_t c = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
  for (; c + 32 <= count; c += 32) {
    const auto* codes = reinterpret_cast<const __m128i*>(src + c);
    const __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes)));
    const __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes + 1)));
    _mm512_storeu_si512(dst + c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low)));  // low's 16, then high's
  }
#endif
  for (; c < count; ++c) {
    const float v = static_cast<float>(src[c]);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    dst[c] = static_cast<uint16_t>(bits >> 16);
  }
}

#pragma GCC diagnostic pop

// x [M, K] bfloat16 @ (q [N, K] int8 * scale [N])^T -> float32 [M, N]: each tile of 64 weight rows is brgemm's A
// (the codes as bfloat16: exact) against x's columns as its B, and the product's rows are scaled and transposed out.
Tensor int8_tiles_mm(const Tensor& x, const Tensor& q, const Tensor& scale, bool vnni) {
  TORCH_CHECK_VALUE(!vnni || tiles_vnni(), "this CPU's brgemm takes no pairs of bfloat16 columns");
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int8 tiles multiply bfloat16 rows [M, K]");
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous() && q.size(1) == k && k % 2 == 0,
                    "an int8 weight [rows, ", k, "] (even), not ", q.sizes());
  TORCH_CHECK_VALUE(scale.dim() == 1 && scale.size(0) == n && scale.is_contiguous(), "int8 scales must be [", n, "]");
  const Tensor scales = scale.to(at::kFloat).contiguous();
  // brgemm's B: x's columns, as pairs per row ([K / 2][M][2]: x's 32-bit words transposed) or rows ([K][M])
  const Tensor b = vnni ? x.contiguous().view(at::kInt).t().contiguous() : x.t().contiguous();
  Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  const auto* bp = reinterpret_cast<const at::BFloat16*>(b.data_ptr());
  const int8_t* codes = q.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* o = out.data_ptr<float>();
  constexpr int64_t ROWS = 64;
  at::parallel_for(0, (n + ROWS - 1) / ROWS, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> tile(ROWS * TILE_K);
    std::vector<float> product(ROWS * m);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t first = unit * ROWS, count = std::min(ROWS, n - first);
      for (int64_t k0 = 0; k0 < k; k0 += TILE_K) {
        const int64_t kc = std::min(TILE_K, k - k0);
        for (int64_t r = 0; r < count; ++r) {
          int8_to_bf16(codes + (first + r) * k + k0, tile.data() + r * kc, kc);
        }
        at::native::cpublas::brgemm(count, m, kc, kc, m, m, k0 > 0, reinterpret_cast<const at::BFloat16*>(tile.data()),
                                    bp + k0 * m, product.data(), vnni);
      }
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t i = 0; i < m; ++i) o[i * n + first + r] = product[r * m + i] * sp[first + r];
      }
    }
    at::native::cpublas::brgemm_release(vnni);
  });
  return out;
}

// ---- the exact float32 head over int8 and int4 weights ----
//
// Why: a step that needs every logit exact (sampling without top-k, logprobs, a logit bias, a flat row of a greedy
// pick) computed float32 over the head's weights dequantized a block of rows at a time: ~270 ms a row for a 3B
// model's 49152 x 2048 int8 head, where its bfloat16 product takes ~7 ms. Here each code is widened to float32 as it
// is read and the row scale multiplies the sum: q * scale is exact in float32 (7 bits by bfloat16's 8), so this is
// the dequantized weights' product up to the float32 sums' order, which is fixed: 16 lanes over k, then a pairwise
// sum of the lanes, with separate multiplies and adds (no fused ones: the build keeps -ffp-contract=off), the same
// on every machine and at any number of rows.

constexpr int64_t EXACT_LANES = 16;

template <int NB, int MB>
void exact_int8_block(const float* x, int64_t k, const int8_t* q, const float* scale, int64_t n, int64_t n0,
                      int64_t m0, float* out) {
  float acc[NB][MB][EXACT_LANES] = {};
  const int64_t full = k / EXACT_LANES * EXACT_LANES;
  for (int64_t k0 = 0; k0 < full; k0 += EXACT_LANES) {
    float w[NB][EXACT_LANES];
    for (int r = 0; r < NB; ++r) {
      for (int64_t l = 0; l < EXACT_LANES; ++l) w[r][l] = static_cast<float>(q[(n0 + r) * k + k0 + l]);
    }
    for (int i = 0; i < MB; ++i) {
      const float* xi = x + (m0 + i) * k + k0;
      for (int r = 0; r < NB; ++r) {
        for (int64_t l = 0; l < EXACT_LANES; ++l) acc[r][i][l] += w[r][l] * xi[l];
      }
    }
  }
  for (int64_t c = full; c < k; ++c) {  // the last columns, each into its own lane
    for (int r = 0; r < NB; ++r) {
      for (int i = 0; i < MB; ++i) acc[r][i][c - full] += static_cast<float>(q[(n0 + r) * k + c]) * x[(m0 + i) * k + c];
    }
  }
  for (int r = 0; r < NB; ++r) {
    for (int i = 0; i < MB; ++i) {
      float* lanes = acc[r][i];
      for (int64_t width = EXACT_LANES / 2; width > 0; width /= 2) {
        for (int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
      }
      out[(m0 + i) * n + n0 + r] = lanes[0] * scale[n0 + r];
    }
  }
}

template <int NB>
void exact_int8_rows(const float* x, int64_t m, int64_t k, const int8_t* q, const float* scale, int64_t n, int64_t n0,
                     float* out) {
  int64_t m0 = 0;
  for (; m0 + 4 <= m; m0 += 4) exact_int8_block<NB, 4>(x, k, q, scale, n, n0, m0, out);
  for (; m0 + 2 <= m; m0 += 2) exact_int8_block<NB, 2>(x, k, q, scale, n, n0, m0, out);
  for (; m0 < m; ++m0) exact_int8_block<NB, 1>(x, k, q, scale, n, n0, m0, out);
}

// x [M, K] float32 @ (q [N, K] int8 * scale [N])^T -> float32 [M, N]
Tensor int8_exact_mm(const Tensor& x, const Tensor& q, const Tensor& scale) {
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == at::kFloat, "the exact head multiplies float32 rows [M, K]");
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous() && q.size(1) == k,
                    "an int8 weight [rows, ", k, "], not ", q.sizes());
  TORCH_CHECK_VALUE(scale.dim() == 1 && scale.size(0) == n, "int8 scales must be [", n, "]");
  const Tensor rows = x.contiguous();
  const Tensor scales = scale.to(at::kFloat).contiguous();
  Tensor out = at::empty({m, n}, x.options());
  const float* xp = rows.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* o = out.data_ptr<float>();
  constexpr int64_t NB = 4;
  at::parallel_for(0, (n + NB - 1) / NB, 64, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t n0 = block * NB;
      if (n0 + NB <= n) {
        exact_int8_rows<NB>(xp, m, k, qp, sp, n, n0, o);
      } else {
        for (int64_t r = n0; r < n; ++r) exact_int8_rows<1>(xp, m, k, qp, sp, n, r, o);
      }
    }
  });
  return out;
}

// x [M, K] float32 @ the int4 weight (torch's packing, as int4_tiles_mm takes it)^T -> float32 [M, padded rows]:
// each weight rebuilt as the module's dequantize() does, (code - 8) * scale (exact) + zero (one rounding), and summed
// over k in order for every row (a 3B model's 49152 x 2048 int4 head: ~1.8 s a row through dequantize's read-back
// in Python, a few ms here)
Tensor int4_exact_mm(const Tensor& x, const Tensor& packed, const Tensor& sz, int64_t block, bool split) {
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == at::kFloat, "the exact head multiplies float32 rows [M, K]");
  const int64_t m = x.size(0), k = x.size(1), padded = packed.size(0);
  check_int4_packing(packed, sz, k, block);
  const Tensor rows = x.contiguous();
  Tensor out = at::empty({m, padded}, x.options());
  const float* xp = rows.data_ptr<float>();
  const uint8_t* weights = packed.data_ptr<uint8_t>();
  const auto* scales = sz.data_ptr<c10::BFloat16>();
  float* o = out.data_ptr<float>();
  const int64_t full = padded / block * block, units = (padded + block - 1) / block;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(m * block), w(block), scale(block), zero(block);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t first = unit * block, count = std::min(block, padded - first), half = count / 2;
      const bool pairs = !(split && count == block && first < full);  // rows 2j, 2j + 1 share byte j; else j, j + half
      const uint8_t* src = weights + first * (k / 2);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t kk = 0; kk < k; ++kk) {
        if (kk % 32 == 0) {
          const c10::BFloat16* group = scales + ((kk / 32) * padded + first) * 2;
          for (int64_t r = 0; r < count; ++r) {
            scale[r] = static_cast<float>(group[2 * r]);
            zero[r] = static_cast<float>(group[2 * r + 1]);
          }
        }
        const uint8_t* column = src + kk * half;
        if (pairs) {
          for (int64_t j = 0; j < half; ++j) {
            w[2 * j] = static_cast<float>((column[j] & 15) - 8) * scale[2 * j] + zero[2 * j];
            w[2 * j + 1] = static_cast<float>((column[j] >> 4) - 8) * scale[2 * j + 1] + zero[2 * j + 1];
          }
        } else {
          for (int64_t j = 0; j < half; ++j) {
            w[j] = static_cast<float>((column[j] & 15) - 8) * scale[j] + zero[j];
            w[j + half] = static_cast<float>((column[j] >> 4) - 8) * scale[j + half] + zero[j + half];
          }
        }
        for (int64_t i = 0; i < m; ++i) {
          const float xv = xp[i * k + kk];
          float* a = acc.data() + i * block;
          for (int64_t r = 0; r < count; ++r) a[r] += w[r] * xv;
        }
      }
      for (int64_t i = 0; i < m; ++i) std::copy_n(acc.data() + i * block, count, o + i * padded + first);
    }
  });
  return out;
}

// ---- int4 weights times int8 activations, for steps of a few rows ----
//
// Why: the bfloat16 tiles convert every weight to bfloat16 once per step (a float conversion and a multiply-add per
// weight: ~80 % of their time at 16 rows), and torch's kernel costs the same per row however many rows share a
// weight. Here each row of activations is quantized to int8 per group of 32 (a scale per group, as llama.cpp's q8_0),
// the codes stay 4-bit integers, and AVX512-VNNI multiplies 64 code x activation pairs per instruction into int32;
// the group's scale and zero are applied once per group: w = (code - 8) s + z, so x.w = s as (sum code q) +
// (z - 8 s) as (sum q). torch's packing puts 64 rows' nibbles of one column side by side: one byte permutation
// (AVX512-VBMI) per 4 columns lays them out as VNNI's groups of 4 along k. On an 11008x2048 weight, cold: 1.8 ms for
// 8 rows against 2.6 (torch's kernel) and 2.8 (tiles); at 16 rows the tiles' AMX products catch up (2.5 against 2.9
// on that weight, 3.3 against 2.7 on a 2048x11008 one), so which rows take this route is measured at load per input
// width (tiles.py). Each row's result depends on that row only.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define STUDIO_INT4_VNNI 1
#endif

bool int4_vnni() {  // the fast path was built for this CPU (elsewhere every unit takes the plain loops: never chosen)
#if defined(STUDIO_INT4_VNNI)
  return true;
#else
  return false;
#endif
}

// rows [M, K] bfloat16 -> int8 codes, a float scale per group of 32, scale * (sum of the group's codes), and that sum
// where `sums` is given: the specification (and what a CPU without AVX-512 runs)
[[maybe_unused]] void quantize_groups_plain(const c10::BFloat16* x, int64_t m, int64_t k, int8_t* q, float* scale,
                                            float* total, int32_t* sums) {
  const int64_t groups = k / 32;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      const c10::BFloat16* src = x + i * k + g * 32;
      float amax = 0.0f;
      for (int64_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(static_cast<float>(src[j])));
      const float step = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      for (int64_t j = 0; j < 32; ++j) {
        // halves away from zero, as llama.cpp's q8_0 (std::round: whatever the thread's rounding mode)
        const int code = static_cast<int>(std::round(static_cast<float>(src[j]) * inverse));
        q[i * k + g * 32 + j] = static_cast<int8_t>(std::clamp(code, -127, 127));
        sum += q[i * k + g * 32 + j];
      }
      scale[i * groups + g] = step;
      total[i * groups + g] = step * static_cast<float>(sum);
      if (sums != nullptr) sums[i * groups + g] = sum;
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#pragma GCC diagnostic push  // as above: GCC 12's own intrinsics' don't-care lanes
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// quantize_groups_plain's codes, scales and totals bit for bit, a group of 32 in two vectors: the plain loop calls
// roundf per value, which cost 0.7 ms of a 16-row product with 11008 inputs (a third of it)
void quantize_groups_vector(const c10::BFloat16* x, int64_t m, int64_t k, int8_t* q, float* scale, float* total,
                            int32_t* sums) {
  const int64_t groups = k / 32;
  at::parallel_for(0, m * groups, 256, [&](int64_t begin, int64_t end) {
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    const __m512i most = _mm512_set1_epi32(127), least = _mm512_set1_epi32(-127);
    for (int64_t at = begin; at < end; ++at) {
      const int64_t i = at / groups, g = at % groups;
      const auto* src = reinterpret_cast<const __m256i*>(x + i * k + g * 32);
      __m512 v[2];
      for (int h = 0; h < 2; ++h) {  // bfloat16 -> float32: its 16 bits become the high half, exactly
        v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(src + h)), 16));
      }
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
      const float step = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      __m512i codes[2];
      for (int h = 0; h < 2; ++h) {
        // halves away from zero, as std::round: the truncation, plus the sign where the dropped part (exact) >= 0.5
        const __m512 p = _mm512_mul_ps(v[h], _mm512_set1_ps(inverse));
        const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(p, t)), half, _CMP_GE_OQ);
        const __m512 away = _mm512_castsi512_ps(
            _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(p), sign), _mm512_castps_si512(one)));
        const __m512i code = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, away));
        codes[h] = _mm512_max_epi32(_mm512_min_epi32(code, most), least);
      }
      int8_t* out = q + i * k + g * 32;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(codes[0]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(codes[1]));
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(codes[0], codes[1]));
      scale[i * groups + g] = step;
      total[i * groups + g] = step * static_cast<float>(sum);
      if (sums != nullptr) sums[i * groups + g] = sum;
    }
  });
}
#pragma GCC diagnostic pop
#endif

void quantize_groups(const c10::BFloat16* x, int64_t m, int64_t k, int8_t* q, float* scale, float* total,
                     int32_t* sums = nullptr) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  quantize_groups_vector(x, m, k, q, scale, total, sums);
#else
  quantize_groups_plain(x, m, k, q, scale, total, sums);
#endif
}

// the rows of a packing unit that is not a whole split block of 64 (row pairs share a byte, or a short last block)
void int4_vnni_unit_plain(const uint8_t* src, int64_t count, bool pairs, const c10::BFloat16* sz, int64_t padded,
                          int64_t row0, int64_t k, const int8_t* q, const float* scale, const float* total, int64_t m,
                          float* out) {
  const int64_t half = count / 2, groups = k / 32;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t byte = pairs ? r / 2 : r % half;
    const bool high = pairs ? r % 2 == 1 : r >= half;
    for (int64_t i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int dot = 0;
        for (int64_t c = g * 32; c < g * 32 + 32; ++c) {
          const uint8_t packed = src[c * half + byte];
          dot += (high ? packed >> 4 : packed & 15) * q[i * k + c];
        }
        const float s = static_cast<float>(sz[(g * padded + row0 + r) * 2]);
        const float z = static_cast<float>(sz[(g * padded + row0 + r) * 2 + 1]);
        // the vector path's operations, fused alike: the same sums bit for bit
        sum = std::fma(static_cast<float>(dot), s * scale[i * groups + g], sum);
        sum = std::fma(z - 8.0f * s, total[i * groups + g], sum);
      }
      out[i * padded + row0 + r] = sum;
    }
  }
}

#if defined(STUDIO_INT4_VNNI)
#pragma GCC diagnostic push  // as above: GCC 12's own intrinsics' don't-care lanes
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Columns 4 quad .. 4 quad + 3 of a group (32 columns of 32 bytes) of a whole split block of 64 weight rows (byte j
// of a column: rows j and j + 32), as VNNI's groups of 4 along k: weight rows 0..15, 16..31 (low nibbles), 32..47,
// 48..63 (high), 16 rows x 4 columns each
inline void vnni_codes(const uint8_t* columns, int quad, __m512i codes[4]) {
  // byte 4j + c of the result: column c's byte j (j < 16; the second permutation takes bytes 16..31)
  alignas(64) static constexpr uint8_t ORDER[64] = {
      0, 32, 64, 96,  1, 33, 65, 97,  2, 34, 66, 98,  3, 35, 67, 99,  4, 36, 68, 100, 5, 37, 69, 101,
      6, 38, 70, 102, 7, 39, 71, 103, 8, 40, 72, 104, 9, 41, 73, 105, 10, 42, 74, 106, 11, 43, 75, 107,
      12, 44, 76, 108, 13, 45, 77, 109, 14, 46, 78, 110, 15, 47, 79, 111};
  const __m512i first = _mm512_load_si512(ORDER);
  const __m512i second = _mm512_add_epi8(first, _mm512_set1_epi8(16));
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i a = _mm512_loadu_si512(columns + quad * 128);
  const __m512i b = _mm512_loadu_si512(columns + quad * 128 + 64);
  const __m512i low_rows = _mm512_permutex2var_epi8(a, first, b), high_rows = _mm512_permutex2var_epi8(a, second, b);
  codes[0] = _mm512_and_si512(low_rows, nibble);
  codes[1] = _mm512_and_si512(high_rows, nibble);
  codes[2] = _mm512_and_si512(_mm512_srli_epi16(low_rows, 4), nibble);
  codes[3] = _mm512_and_si512(_mm512_srli_epi16(high_rows, 4), nibble);
}

// group g's scale and z - 8 s of weight rows row0 + 16 r .. + 15, as floats
inline void group_scales(const c10::BFloat16* sz, int64_t g, int64_t padded, int64_t row0, int r, __m512& s,
                         __m512& offset) {
  const __m512i both = _mm512_loadu_si512(sz + (g * padded + row0 + 16 * r) * 2);
  s = _mm512_castsi512_ps(_mm512_slli_epi32(both, 16));
  const __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(both, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  offset = _mm512_sub_ps(zero, _mm512_mul_ps(_mm512_set1_ps(8.0f), s));
}

// MC rows of activations against a whole split block of 64 weight rows
template <int MC>
void int4_vnni_block64(const uint8_t* src, const c10::BFloat16* sz, int64_t padded, int64_t row0, int64_t k,
                       const int8_t* q, const float* scale, const float* total, int64_t m0, float* out) {
  const int64_t groups = k / 32;
  __m512 result[MC][4];
  for (int i = 0; i < MC; ++i) {
    for (int r = 0; r < 4; ++r) result[i][r] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* columns = src + g * 32 * 32;  // 32 columns of 32 bytes
    _mm_prefetch(reinterpret_cast<const char*>(columns + 4 * 1024), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(columns + 4 * 1024 + 512), _MM_HINT_T0);
    __m512i dot[MC][4];
    for (int i = 0; i < MC; ++i) {
      for (int r = 0; r < 4; ++r) dot[i][r] = _mm512_setzero_si512();
    }
    for (int quad = 0; quad < 8; ++quad) {  // columns 4 quad .. 4 quad + 3
      __m512i codes[4];
      vnni_codes(columns, quad, codes);
      for (int i = 0; i < MC; ++i) {
        int32_t four;
        std::memcpy(&four, q + (m0 + i) * k + g * 32 + quad * 4, 4);
        const __m512i activations = _mm512_set1_epi32(four);
        for (int r = 0; r < 4; ++r) dot[i][r] = _mm512_dpbusd_epi32(dot[i][r], codes[r], activations);
      }
    }
    for (int r = 0; r < 4; ++r) {
      __m512 s, offset;
      group_scales(sz, g, padded, row0, r, s, offset);
      for (int i = 0; i < MC; ++i) {  // fused: one rounding each (the plain loops use std::fma alike)
        const __m512 step = _mm512_set1_ps(scale[(m0 + i) * groups + g]);
        const __m512 sum = _mm512_set1_ps(total[(m0 + i) * groups + g]);
        result[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][r]), _mm512_mul_ps(s, step), result[i][r]);
        result[i][r] = _mm512_fmadd_ps(offset, sum, result[i][r]);
      }
    }
  }
  for (int i = 0; i < MC; ++i) {
    for (int r = 0; r < 4; ++r) _mm512_storeu_ps(out + (m0 + i) * padded + row0 + 16 * r, result[i][r]);
  }
}
#pragma GCC diagnostic pop
#endif

// ---- the same products with AMX tiles, for steps of more rows ----
//
// Why: at 16 rows VNNI's dot products cost rows x weights / 64 instructions, and the whole block's unpacking is
// repeated per 4 rows; an AMX tile multiply takes 16 rows x 16 weight rows x 32 inputs at once (TDPBSUD: signed
// activations, unsigned codes). The codes are laid out as VNNI's (the same byte permutation), stored as a tile's
// rows, multiplied one group of 32 inputs at a time (its int32 sums per group), and the group's scale and zero are
// applied to the sums exactly as the VNNI route does: the two give the same floats, bit for bit. On 11008x2048 and
// 2048x11008 weights (cold) at 16 rows: 1.4 ms against the bfloat16 tiles' 2.4-2.6 and VNNI's 1.9-2.7.

#if defined(STUDIO_INT4_VNNI) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define STUDIO_INT4_AMX 1
#endif

bool int4_amx() {  // built with AMX, and the kernel lets this process use its tiles (asked once)
#if defined(STUDIO_INT4_AMX)
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: without it a tile instruction is an illegal instruction
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
#else
  return false;
#endif
}

#if defined(STUDIO_INT4_AMX)
#pragma GCC diagnostic push  // as above: GCC 12's own intrinsics' don't-care lanes
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// LDTILECFG's 64 bytes: palette 1, then each tile's bytes per row and rows
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// A thread's tiles back to their initial state once it is done with them. torch's brgemm remembers the configuration
// it loaded last and skips loading it again: it is told to forget it.
void release_tiles() {
  _tile_release();
  at::native::cpublas::brgemm_release(true);
}

// tiles: 0 the activations (mc rows x 32 inputs), 1-2 codes (8 rows of 4 inputs x 16 weight rows), 4-7 the sums
void configure_amx(int64_t mc) {
  TileConfig config;
  config.rows[0] = static_cast<uint8_t>(mc);
  config.bytes_per_row[0] = 32;
  for (int t = 1; t <= 2; ++t) {
    config.rows[t] = 8;
    config.bytes_per_row[t] = 64;
  }
  for (int t = 4; t <= 7; ++t) {
    config.rows[t] = static_cast<uint8_t>(mc);
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
}

// rows m0..m0 + mc (at most 16) of activations against a whole split block of 64 weight rows
void int4_amx_block64(const uint8_t* src, const c10::BFloat16* sz, int64_t padded, int64_t row0, int64_t k,
                      const int8_t* q, const float* scale, const float* total, int64_t m0, int64_t mc, float* out) {
  const int64_t groups = k / 32;
  alignas(64) uint8_t codes[4][8][64];   // weight rows 16 r..: the group's codes as a tile (4 inputs a weight row)
  alignas(64) int32_t sums[4][16][16];   // their int32 sums per activation row
  __m512 result[16][4];
  for (int i = 0; i < 16; ++i) {
    for (int r = 0; r < 4; ++r) result[i][r] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* columns = src + g * 32 * 32;  // 32 columns of 32 bytes
    _mm_prefetch(reinterpret_cast<const char*>(columns + 4 * 1024), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(columns + 4 * 1024 + 512), _MM_HINT_T0);
    for (int quad = 0; quad < 8; ++quad) {  // columns 4 quad .. 4 quad + 3, as int4_vnni_block64 lays them out
      __m512i laid[4];
      vnni_codes(columns, quad, laid);
      for (int r = 0; r < 4; ++r) _mm512_store_si512(codes[r][quad], laid[r]);
    }
    _tile_loadd(0, q + m0 * k + g * 32, k);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    _tile_loadd(1, codes[0], 64);
    _tile_loadd(2, codes[1], 64);
    _tile_dpbsud(4, 0, 1);
    _tile_dpbsud(5, 0, 2);
    _tile_loadd(1, codes[2], 64);
    _tile_loadd(2, codes[3], 64);
    _tile_dpbsud(6, 0, 1);
    _tile_dpbsud(7, 0, 2);
    _tile_stored(4, sums[0], 64);
    _tile_stored(5, sums[1], 64);
    _tile_stored(6, sums[2], 64);
    _tile_stored(7, sums[3], 64);
    for (int r = 0; r < 4; ++r) {  // int4_vnni_block64's epilogue, operation for operation
      __m512 s, offset;
      group_scales(sz, g, padded, row0, r, s, offset);
      for (int64_t i = 0; i < mc; ++i) {
        const __m512 step = _mm512_set1_ps(scale[(m0 + i) * groups + g]);
        const __m512 sum = _mm512_set1_ps(total[(m0 + i) * groups + g]);
        const __m512i dot = _mm512_load_si512(sums[r][i]);
        result[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, step), result[i][r]);
        result[i][r] = _mm512_fmadd_ps(offset, sum, result[i][r]);
      }
    }
  }
  for (int64_t i = 0; i < mc; ++i) {
    for (int r = 0; r < 4; ++r) _mm512_storeu_ps(out + (m0 + i) * padded + row0 + 16 * r, result[i][r]);
  }
}
#pragma GCC diagnostic pop
#endif

// x [M, K] bfloat16 @ the int4 weight (torch's packing) -> float32 [M, padded rows], activations as int8: whole split
// blocks by VNNI dot products or AMX tiles (the same floats), the rest by plain loops
Tensor int4_int8_activations_mm(const Tensor& x, const Tensor& packed, const Tensor& sz, int64_t block, bool split,
                                bool amx) {
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int8 activations are bfloat16 rows [M, K]");
  TORCH_CHECK_VALUE(!amx || int4_amx(), "this CPU or build has no AMX int8 tiles");
  const int64_t m = x.size(0), k = x.size(1), padded = packed.size(0);
  check_int4_packing(packed, sz, k, block);
  const Tensor rows = x.contiguous();
  std::vector<int8_t> q(m * k);
  std::vector<float> scale(m * k / 32), total(m * k / 32);
  quantize_groups(rows.data_ptr<at::BFloat16>(), m, k, q.data(), scale.data(), total.data());
  Tensor out = at::empty({m, padded}, x.options().dtype(at::kFloat));
  const uint8_t* weights = packed.data_ptr<uint8_t>();
  const auto* scales = sz.data_ptr<c10::BFloat16>();
  float* o = out.data_ptr<float>();
  const int8_t* qp = q.data();
  const float *sp = scale.data(), *tp = total.data();
  const int64_t full = padded / block * block, units = (padded + block - 1) / block;
  const auto work = [&](int64_t begin, int64_t end) {
#if defined(STUDIO_INT4_AMX)
    int64_t configured = 0;
#endif
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t first = unit * block, count = std::min(block, padded - first);
      const bool pairs = !(split && count == block && first < full);
      const uint8_t* src = weights + first * (k / 2);
#if defined(STUDIO_INT4_VNNI)
      if (count == 64 && !pairs) {
#if defined(STUDIO_INT4_AMX)
        if (amx) {
          for (int64_t m0 = 0; m0 < m; m0 += 16) {
            const int64_t mc = std::min<int64_t>(16, m - m0);
            if (mc != configured) configure_amx(mc);
            configured = mc;
            int4_amx_block64(src, scales, padded, first, k, qp, sp, tp, m0, mc, o);
          }
          continue;
        }
#endif
        int64_t m0 = 0;
        for (; m0 + 4 <= m; m0 += 4) int4_vnni_block64<4>(src, scales, padded, first, k, qp, sp, tp, m0, o);
        for (; m0 + 2 <= m; m0 += 2) int4_vnni_block64<2>(src, scales, padded, first, k, qp, sp, tp, m0, o);
        for (; m0 < m; ++m0) int4_vnni_block64<1>(src, scales, padded, first, k, qp, sp, tp, m0, o);
        continue;
      }
#endif
      int4_vnni_unit_plain(src, count, pairs, scales, padded, first, k, qp, sp, tp, m, o);
    }
#if defined(STUDIO_INT4_AMX)
    if (configured) release_tiles();
#endif
  };
  if (amx) {
    at::parallel_for(0, units, 1, work);  // a thread's tiles are configured once for its whole share
  } else {
    parallel_claimed(units, work);
  }
  return out;
}

Tensor int4_vnni_mm(const Tensor& x, const Tensor& packed, const Tensor& sz, int64_t block, bool split) {
  return int4_int8_activations_mm(x, packed, sz, block, split, false);
}

Tensor int4_amx_mm(const Tensor& x, const Tensor& packed, const Tensor& sz, int64_t block, bool split) {
  return int4_int8_activations_mm(x, packed, sz, block, split, true);
}

// ---- int8 weights times int8 activations with AMX tiles ----
//
// Why: at 16 rows the bfloat16 tiles convert every int8 code to bfloat16 once per step, which made the int8 weights
// (a Q4_K_M file's Q6_K tensors, held as int8) cost 3x what an int4 weight does per code once those took AMX's int8
// tiles. Here the codes are the tiles as they are stored (a weight row's 32 codes of a group are a tile row: no
// conversion), the activations are quantized as int4_vnni_mm's are (int8 per group of 32) and laid out as the tile
// TDPBSSD multiplies them by (4 inputs of one row side by side), and each group's int32 sums are scaled by the
// group's activation steps: out = scale x (sum over groups of step x sum), fused in group order.

#if defined(STUDIO_INT4_AMX)
#pragma GCC diagnostic push  // as above: GCC 12's own intrinsics' don't-care lanes
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// tiles: 0 the codes (`rows` weight rows x 32 inputs), 1 the activations (8 rows of 4 inputs x 16 rows), 2 the sums
void configure_int8_amx(int64_t rows) {
  TileConfig config;
  config.rows[0] = config.rows[2] = static_cast<uint8_t>(rows);
  config.bytes_per_row[0] = 32;
  config.rows[1] = 8;
  config.bytes_per_row[1] = config.bytes_per_row[2] = 64;
  _tile_loadconfig(&config);
}
#pragma GCC diagnostic pop
#endif

// ---- int8 weights times int8 activations with VNNI dot products, for CPUs without AMX ----
//
// Why: torch's int8 kernel converts every code to float and costs as much per row however many rows share a weight;
// on 2 Zen cores a 3B Q4_K_M file's int8 weights (its Q6_K tensors) streamed at ~24 GB/s against the int4 VNNI
// route's ~37. Here 16 weight rows' 32 codes of a group are turned into VNNI's layout in registers (8 words of 4
// codes per row: a 16 x 8 word transpose, shared by every row of activations), made unsigned (code + 128, one xor),
// and multiplied by the int8 activations with one instruction per 4 inputs of 16 rows; the offset's share,
// 128 x (sum of the group's activation codes), starts each group's sum below zero, so the sums are the exact int32
// ones the AMX tiles give, and each group is scaled as there (fused, in group order): the same floats, bit for bit.

#if defined(STUDIO_INT4_VNNI)
#pragma GCC diagnostic push  // as above: GCC 12's own intrinsics' don't-care lanes
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// group g of weight rows row0 .. row0 + 15 (rows past `count` read as zeros) as 8 words per row, unsigned:
// words[j] lane r = codes 4j .. 4j + 3 of row row0 + r, each + 128
inline void int8_vnni_words(const int8_t* weights, int64_t k, int64_t row0, int64_t count, int64_t g,
                            __m512i words[8]) {
  __m256i rows[16];
  for (int r = 0; r < 16; ++r) {
    rows[r] = r < count ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(weights + (row0 + r) * k + g * 32))
                        : _mm256_setzero_si256();
  }
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i y[8], t[8], u[8];
  for (int p = 0; p < 8; ++p) {  // lanes 0..7: row p's 8 words, 8..15: row p + 8's
    y[p] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(rows[p]), rows[p + 8], 1), offset);
  }
  for (int p = 0; p < 8; p += 2) {  // an 8 x 8 word transpose in each half, 128 bits at a time
    t[p] = _mm512_unpacklo_epi32(y[p], y[p + 1]);
    t[p + 1] = _mm512_unpackhi_epi32(y[p], y[p + 1]);
  }
  for (int h = 0; h < 8; h += 4) {  // u[h + w], per 128 bits: rows h .. h + 3 (h + 8 ..) of words w and w + 4
    u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
    u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
    u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
    u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
  }
  const __m512i low = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), high = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int w = 0; w < 4; ++w) {  // rows 0..3, 4..7, 8..11, 12..15 in order
    words[w] = _mm512_permutex2var_epi64(u[w], low, u[w + 4]);
    words[w + 4] = _mm512_permutex2var_epi64(u[w], high, u[w + 4]);
  }
}

// MC rows of activations (from m0) against weight rows row0 .. row0 + count - 1 (count <= 16)
template <int MC>
void int8_vnni_block16(const int8_t* weights, int64_t k, int64_t row0, int64_t count, const float* scale,
                       const int8_t* q, const float* step, const int32_t* sums, int64_t m0, int64_t n, float* out) {
  const int64_t groups = k / 32;
  __m512 acc[MC];
  for (int i = 0; i < MC; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    if (g % 2 == 0 && g + 8 < groups) {  // each row's cache line 4 lines ahead
      for (int64_t r = 0; r < count; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(weights + (row0 + r) * k + (g + 8) * 32), _MM_HINT_T0);
      }
    }
    __m512i words[8];
    int8_vnni_words(weights, k, row0, count, g, words);
    for (int i = 0; i < MC; ++i) {
      const int64_t at = (m0 + i) * groups + g;
      const int8_t* codes = q + (m0 + i) * k + g * 32;
      __m512i dot = _mm512_set1_epi32(-128 * sums[at]);  // the unsigned codes' offset, 128 x the activations
      for (int w = 0; w < 8; ++w) {
        int32_t four;
        std::memcpy(&four, codes + 4 * w, 4);
        dot = _mm512_dpbusd_epi32(dot, words[w], _mm512_set1_epi32(four));
      }
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(step[at]), acc[i]);
    }
  }
  const __mmask16 kept = count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
  const __m512 scales = _mm512_maskz_loadu_ps(kept, scale + row0);
  for (int i = 0; i < MC; ++i) _mm512_mask_storeu_ps(out + (m0 + i) * n + row0, kept, _mm512_mul_ps(acc[i], scales));
}
#pragma GCC diagnostic pop
#endif

// the specification, and what a CPU without VNNI runs: per row and weight row, each group's exact int32 sum scaled by
// its step, fused in group order, then the weight row's scale
[[maybe_unused]] void int8_activations_plain(const int8_t* weights, int64_t k, int64_t row0, int64_t count,
                                             const float* scale, const int8_t* q, const float* step, int64_t m,
                                             int64_t n, float* out) {
  const int64_t groups = k / 32;
  for (int64_t r = row0; r < row0 + count; ++r) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t c = g * 32; c < g * 32 + 32; ++c) dot += static_cast<int32_t>(weights[r * k + c]) * q[i * k + c];
        acc = std::fma(static_cast<float>(dot), step[i * groups + g], acc);
      }
      out[i * n + r] = acc * scale[r];
    }
  }
}

#pragma GCC diagnostic push  // as above: GCC 12's own intrinsics' don't-care lanes
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// x [M, K] bfloat16 @ (q [N, K] int8 * scale [N])^T -> float32 [M, N], activations as int8 (K a multiple of 32): with
// AMX tiles, or VNNI dot products (plain loops where the build has none): the same floats either way
Tensor int8_int8_activations_mm(const Tensor& x, const Tensor& q, const Tensor& scale, bool amx) {
  TORCH_CHECK_VALUE(!amx || int4_amx(), "this CPU or build has no AMX int8 tiles");
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int8 activations are bfloat16 rows [M, K]");
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous() && q.size(1) == k && k % 32 == 0,
                    "an int8 weight [rows, ", k, "] (a multiple of 32), not ", q.sizes());
  TORCH_CHECK_VALUE(scale.dim() == 1 && scale.size(0) == n && scale.is_contiguous(), "int8 scales must be [", n, "]");
  Tensor out = at::empty({m, n}, x.options().dtype(at::kFloat));
  const Tensor scales = scale.to(at::kFloat).contiguous();
  const Tensor rows = x.contiguous();
  const int64_t groups = k / 32;
  std::vector<int8_t> codes(m * k);
  std::vector<float> step(m * groups), total(m * groups);
  std::vector<int32_t> sums(amx ? 0 : m * groups);  // each group's codes' sum: VNNI's unsigned codes' offset times it
  quantize_groups(rows.data_ptr<at::BFloat16>(), m, k, codes.data(), step.data(), total.data(),
                  amx ? nullptr : sums.data());
  const int8_t* weights = q.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* o = out.data_ptr<float>();
  if (!amx) {
#if defined(STUDIO_INT4_VNNI)
    const int8_t* cp = codes.data();
    const float* stp = step.data();
    const int32_t* sump = sums.data();
    parallel_claimed((n + 15) / 16, [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t row0 = unit * 16, count = std::min<int64_t>(16, n - row0);
        int64_t m0 = 0;
        for (; m0 + 8 <= m; m0 += 8) int8_vnni_block16<8>(weights, k, row0, count, sp, cp, stp, sump, m0, n, o);
        for (; m0 + 4 <= m; m0 += 4) int8_vnni_block16<4>(weights, k, row0, count, sp, cp, stp, sump, m0, n, o);
        for (; m0 + 2 <= m; m0 += 2) int8_vnni_block16<2>(weights, k, row0, count, sp, cp, stp, sump, m0, n, o);
        for (; m0 < m; ++m0) int8_vnni_block16<1>(weights, k, row0, count, sp, cp, stp, sump, m0, n, o);
      }
    });
#else
    at::parallel_for(0, (n + 15) / 16, 1, [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t row0 = unit * 16;
        int8_activations_plain(weights, k, row0, std::min<int64_t>(16, n - row0), sp, codes.data(), step.data(), m, n,
                               o);
      }
    });
#endif
    return out;
  }
#if defined(STUDIO_INT4_AMX)
  const int64_t chunks = (m + 15) / 16;
  // per 16 rows and group: the activations as the tile multiplies them ([8][16] words of 4 inputs; rows past M zero)
  // and their steps across the 16 rows
  std::vector<int32_t> tiles(chunks * groups * 8 * 16, 0);
  std::vector<float> steps(chunks * groups * 16, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t c = i / 16, lane = i % 16;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t word = 0; word < 8; ++word) {
        std::memcpy(&tiles[((c * groups + g) * 8 + word) * 16 + lane], codes.data() + i * k + g * 32 + word * 4, 4);
      }
      steps[(c * groups + g) * 16 + lane] = step[i * groups + g];
    }
  }
  at::parallel_for(0, (n + 15) / 16, 1, [&](int64_t begin, int64_t end) {
    alignas(64) int32_t sums[16][16] = {};
    alignas(64) float done[16][16];
    int64_t configured = 0;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t n0 = unit * 16, count = std::min<int64_t>(16, n - n0);
      if (count != configured) configure_int8_amx(count);
      configured = count;
      for (int64_t c = 0; c < chunks; ++c) {
        __m512 acc[16];
        for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; ++g) {
          _tile_loadd(0, weights + n0 * k + g * 32, k);
          _tile_loadd(1, tiles.data() + (c * groups + g) * 128, 64);
          _tile_zero(2);
          _tile_dpbssd(2, 0, 1);
          _tile_stored(2, sums, 64);
          const __m512 across = _mm512_loadu_ps(steps.data() + (c * groups + g) * 16);
          for (int r = 0; r < 16; ++r) {  // weight row n0 + r, the 16 rows of activations across
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[r])), across, acc[r]);
          }
        }
        for (int r = 0; r < 16; ++r) _mm512_store_ps(done[r], acc[r]);
        const int64_t mc = std::min<int64_t>(16, m - c * 16);
        for (int64_t i = 0; i < mc; ++i) {
          for (int64_t r = 0; r < count; ++r) o[(c * 16 + i) * n + n0 + r] = done[r][i] * sp[n0 + r];
        }
      }
    }
    if (configured) release_tiles();
  });
#endif
  return out;
}
#pragma GCC diagnostic pop

Tensor int8_vnni_mm(const Tensor& x, const Tensor& q, const Tensor& scale) {
  return int8_int8_activations_mm(x, q, scale, false);
}

Tensor int8_amx_mm(const Tensor& x, const Tensor& q, const Tensor& scale) {
  return int8_int8_activations_mm(x, q, scale, true);
}

// out[r, :] as float32, whatever the kernel returned
// ---- float32 and bfloat16 weights read row by row, their rows claimed by the threads ----
//
// Why: oneDNN's prepacked product splits a weight's rows between the threads in fixed shares, so on two cores a
// thread the OS takes off its core for a moment (the window's UI thread, the server's event loop) holds the other at
// the product's end; and at one or two rows it read the embedded model's 30 layers of float32 weights in 16.7 ms where
// these dot products take 14.1 (2 Zen 5 cores, cold weights, measured in turns), and at::linear (weights not
// prepacked: a 16-bit model, or float32 too large for a packed copy) took twice as long. Each output is a row of the
// plain [N, K] weight dotted with each input row, summed in float32 in a fixed order: it does not depend on which
// thread took its rows. bfloat16 weights and inputs: their products are exact in float32 (VDPBF16PS where the CPU has
// it, which adds them in pairs). Which row counts take it is measured at load (engine/model/dense_rows.py).

constexpr int64_t DENSE_UNIT = 16;  // weight rows a claim takes at least (a run of units: parallel_claimed)

#pragma GCC diagnostic push  // GCC 12's own intrinsics' don't-care lanes (_mm512_reduce_add_ps's undefined halves)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define STUDIO_DENSE_LANES 1
struct DenseLanes {  // 16 floats
  using V = __m512;
  static constexpr int64_t WIDTH = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_first(const float* p, int64_t count) { return _mm512_maskz_loadu_ps(mask(count), p); }
  static V load(const c10::BFloat16* p) {  // bfloat16 -> float32: its 16 bits become the high half, exactly
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_first(const c10::BFloat16* p, int64_t count) { return widen(_mm256_maskz_loadu_epi16(mask(count), p)); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  static __mmask16 mask(int64_t count) { return static_cast<__mmask16>((1u << count) - 1); }
  static V widen(__m256i halves) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16)); }
};
#elif defined(__AVX2__) && defined(__FMA__)
#define STUDIO_DENSE_LANES 1
struct DenseLanes {  // 8 floats
  using V = __m256;
  static constexpr int64_t WIDTH = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_first(const float* p, int64_t count) { return _mm256_maskload_ps(p, mask(count)); }
  static V load(const c10::BFloat16* p) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V load_first(const c10::BFloat16* p, int64_t count) {
    alignas(16) uint16_t part[8] = {};
    std::memcpy(part, p, count * sizeof(uint16_t));
    return widen(_mm_load_si128(reinterpret_cast<const __m128i*>(part)));
  }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
  }
  static __m256i mask(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V widen(__m128i halves) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16)); }
};
#endif

#if defined(STUDIO_DENSE_LANES)
// weight rows n .. n + R - 1 dotted with input rows m0 .. m0 + MC - 1 (T: float or c10::BFloat16, both alike)
template <int R, int MC, class T>
inline void dense_block(const T* x, int64_t k, const T* w, int64_t n, int64_t m0, float* out, int64_t ldo) {
  using L = DenseLanes;
  typename L::V acc[R][MC];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MC; ++i) acc[r][i] = L::zero();
  }
  int64_t c = 0;
  for (; c + L::WIDTH <= k; c += L::WIDTH) {
    typename L::V weights[R];
    for (int r = 0; r < R; ++r) weights[r] = L::load(w + (n + r) * k + c);
    for (int i = 0; i < MC; ++i) {
      const typename L::V inputs = L::load(x + (m0 + i) * k + c);
      for (int r = 0; r < R; ++r) acc[r][i] = L::fmadd(weights[r], inputs, acc[r][i]);
    }
  }
  if (c < k) {  // the last columns, the lanes past them zero
    typename L::V weights[R];
    for (int r = 0; r < R; ++r) weights[r] = L::load_first(w + (n + r) * k + c, k - c);
    for (int i = 0; i < MC; ++i) {
      const typename L::V inputs = L::load_first(x + (m0 + i) * k + c, k - c);
      for (int r = 0; r < R; ++r) acc[r][i] = L::fmadd(weights[r], inputs, acc[r][i]);
    }
  }
  for (int i = 0; i < MC; ++i) {
    for (int r = 0; r < R; ++r) out[(m0 + i) * ldo + n + r] = L::sum(acc[r][i]);
  }
}

#if defined(__AVX512BF16__)
// bfloat16 rows with VDPBF16PS: 32 products a lane pair at a time, added into float32 lanes (the last columns: zeros)
template <int R, int MC>
inline void dense_block(const c10::BFloat16* x, int64_t k, const c10::BFloat16* w, int64_t n, int64_t m0, float* out,
                        int64_t ldo) {
  __m512 acc[R][MC];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MC; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  // whole runs of 32 columns with plain loads: a mask computed in the loop kept GCC from holding the accumulators in
  // registers (2.4x slower at two rows)
  int64_t c = 0;
  for (; c + 32 <= k; c += 32) {
    __m512bh weights[R];
    for (int r = 0; r < R; ++r) weights[r] = (__m512bh)_mm512_loadu_si512(w + (n + r) * k + c);
    for (int i = 0; i < MC; ++i) {
      const __m512bh inputs = (__m512bh)_mm512_loadu_si512(x + (m0 + i) * k + c);
      for (int r = 0; r < R; ++r) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], weights[r], inputs);
    }
  }
  if (c < k) {
    const __mmask32 lanes = static_cast<__mmask32>((uint64_t{1} << (k - c)) - 1);
    __m512bh weights[R];
    for (int r = 0; r < R; ++r) weights[r] = (__m512bh)_mm512_maskz_loadu_epi16(lanes, w + (n + r) * k + c);
    for (int i = 0; i < MC; ++i) {
      const __m512bh inputs = (__m512bh)_mm512_maskz_loadu_epi16(lanes, x + (m0 + i) * k + c);
      for (int r = 0; r < R; ++r) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], weights[r], inputs);
    }
  }
  for (int i = 0; i < MC; ++i) {
    for (int r = 0; r < R; ++r) out[(m0 + i) * ldo + n + r] = _mm512_reduce_add_ps(acc[r][i]);
  }
}
#endif

// weight rows n .. n + R - 1 against every input row, MC_MAX at a time (the weight rows stay in L1 between them)
template <int R, class T>
void dense_weight_rows(const T* x, int64_t m, int64_t k, const T* w, int64_t n, float* out, int64_t ldo) {
  constexpr int MC_MAX = DenseLanes::WIDTH == 16 ? 4 : 2;  // accumulators R x MC within the 16 (AVX2) / 32 registers
  int64_t m0 = 0;
  for (; m0 + MC_MAX <= m; m0 += MC_MAX) dense_block<R, MC_MAX>(x, k, w, n, m0, out, ldo);
  for (; m0 + 2 <= m; m0 += 2) dense_block<R, 2>(x, k, w, n, m0, out, ldo);
  for (; m0 < m; ++m0) dense_block<R, 1>(x, k, w, n, m0, out, ldo);
}
#endif
#pragma GCC diagnostic pop

template <class T>
void dense_rows_of(const T* x, int64_t m, int64_t k, const T* w, int64_t first, int64_t last, float* out, int64_t n) {
  int64_t r = first;
#if defined(STUDIO_DENSE_LANES)
  for (; r + 4 <= last; r += 4) dense_weight_rows<4>(x, m, k, w, r, out, n);
  for (; r < last; ++r) dense_weight_rows<1>(x, m, k, w, r, out, n);
#else
  for (; r < last; ++r) {  // plain loops: never chosen (the measurement finds them slower)
    for (int64_t i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (int64_t c = 0; c < k; ++c) sum += static_cast<float>(x[i * k + c]) * static_cast<float>(w[r * k + c]);
      out[i * n + r] = sum;
    }
  }
#endif
}

// x [M, K] @ w [N, K] -> float32 [M, N], both float32 or both bfloat16, the weight's rows claimed in runs of DENSE_UNIT
Tensor dense_claimed_mm(const Tensor& x, const Tensor& w) {
  const auto dtype = w.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kBFloat16, "claimed weights are float32 or bfloat16");
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == dtype, "dense_claimed_mm takes rows [M, K] of the weight's dtype");
  check_rows(w, "a claimed weight", w.size(0), x.size(1), dtype);
  TORCH_CHECK_VALUE(w.is_contiguous(), "a claimed weight must be contiguous");
  const Tensor rows = x.contiguous();
  const int64_t m = rows.size(0), k = rows.size(1), n = w.size(0);
  Tensor out = at::empty({m, n}, rows.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  parallel_claimed((n + DENSE_UNIT - 1) / DENSE_UNIT, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * DENSE_UNIT, last = std::min(n, end * DENSE_UNIT);
    if (dtype == at::kFloat) {
      dense_rows_of(rows.data_ptr<float>(), m, k, w.data_ptr<float>(), first, last, op, n);
    } else {
      dense_rows_of(rows.data_ptr<c10::BFloat16>(), m, k, w.data_ptr<c10::BFloat16>(), first, last, op, n);
    }
  });
  return out;
}

// ---- bfloat16 weights in blocks of 16 rows, column pairs side by side ----
//
// Why: the embedded model's default copy is bfloat16, and oneDNN's packing of it reads its 30 layers at one row in
// 9.3-10.6 ms where these blocks take 6.9-8.1 (2 Zen 5 cores, cold weights, alternated), with rows split between the
// threads in fixed shares. A block holds weight rows 16 b .. 16 b + 15 for columns 2 p and 2 p + 1 as one 64-byte
// vector (VDPBF16PS's pairs), so a product is a broadcast of an input pair and one instruction per 32 weights, with
// no sums across lanes; several blocks share each broadcast where a step has many rows. The blocks are claimed by the
// threads in runs, as the other claimed products. Sums are float32 in a fixed order per output.

constexpr int64_t BLOCK_ROWS = 16, BLOCKS_A_UNIT = 4;  // a unit: the 4 blocks the widest path multiplies at once

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define STUDIO_BF16_BLOCKS 1
#endif

bool bf16_blocks_built() {  // the vector path was built for this CPU (elsewhere plain loops: never chosen)
#if defined(STUDIO_BF16_BLOCKS)
  return true;
#else
  return false;
#endif
}

// w [N, K] (K even) -> bfloat16 [ceil(N / 16), K / 2, 16, 2], the padding rows zero
Tensor bf16_blocks(const Tensor& w) {
  TORCH_CHECK_VALUE(w.dim() == 2 && w.size(1) % 2 == 0, "bfloat16 blocks take a [N, K] weight with K even");
  const Tensor rows = w.to(at::kBFloat16).contiguous();
  const int64_t n = rows.size(0), k = rows.size(1), blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS, pairs = k / 2;
  Tensor out = at::zeros({blocks, pairs, BLOCK_ROWS, 2}, rows.options());
  const uint32_t* src = reinterpret_cast<const uint32_t*>(rows.data_ptr<at::BFloat16>());
  uint32_t* dst = reinterpret_cast<uint32_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t r = 0; r < std::min(BLOCK_ROWS, n - b * BLOCK_ROWS); ++r) {
        const uint32_t* row = src + (b * BLOCK_ROWS + r) * pairs;
        for (int64_t p = 0; p < pairs; ++p) dst[(b * pairs + p) * BLOCK_ROWS + r] = row[p];
      }
    }
  });
  return out;
}

#if defined(STUDIO_BF16_BLOCKS)
#pragma GCC diagnostic push  // as above: GCC 12's own intrinsics' don't-care lanes
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// B consecutive blocks against input rows m0 .. m0 + MC - 1 (pairs: the inputs as 32-bit column pairs)
template <int B, int MC>
inline void bf16_blocks_rows(const uint32_t* x, int64_t pairs, const uint16_t* blocks, int64_t m0, float* out,
                             int64_t ldo, int64_t row0) {
  __m512 acc[B][MC];
  for (int j = 0; j < B; ++j) {
    for (int i = 0; i < MC; ++i) acc[j][i] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh weights[B];
    for (int j = 0; j < B; ++j) weights[j] = (__m512bh)_mm512_loadu_si512(blocks + (j * pairs + p) * 32);
    for (int i = 0; i < MC; ++i) {
      const __m512bh inputs = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[(m0 + i) * pairs + p]));
      for (int j = 0; j < B; ++j) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], weights[j], inputs);
    }
  }
  for (int i = 0; i < MC; ++i) {
    for (int j = 0; j < B; ++j) _mm512_storeu_ps(out + (m0 + i) * ldo + row0 + BLOCK_ROWS * j, acc[j][i]);
  }
}

// rows m0 .. m0 + count - 1 (count <= MC) in one pass over the blocks
template <int B, int MC>
inline void bf16_blocks_some_rows(int64_t count, const uint32_t* x, int64_t pairs, const uint16_t* blocks, int64_t m0,
                                  float* out, int64_t ldo, int64_t row0) {
  if constexpr (MC > 0) {
    if (count == MC) {
      bf16_blocks_rows<B, MC>(x, pairs, blocks, m0, out, ldo, row0);
    } else {
      bf16_blocks_some_rows<B, MC - 1>(count, x, pairs, blocks, m0, out, ldo, row0);
    }
  }
}

// every input row against B blocks, MC rows a pass, the rest in one more: each pass reads the blocks again (from
// L1 or L2), so a few rows more than a pass cost one pass more, not one per row (1.3x oneDNN's at 5-6 rows before)
template <int B, int MC>
inline void bf16_blocks_all_rows(const uint32_t* x, int64_t m, int64_t pairs, const uint16_t* blocks, float* out,
                                 int64_t ldo, int64_t row0) {
  int64_t m0 = 0;
  for (; m0 + MC <= m; m0 += MC) bf16_blocks_rows<B, MC>(x, pairs, blocks, m0, out, ldo, row0);
  if (m0 < m) bf16_blocks_some_rows<B, MC>(m - m0, x, pairs, blocks, m0, out, ldo, row0);
}
#pragma GCC diagnostic pop
#endif

// x [M, K] bfloat16 @ blocks (bf16_blocks of an [N, K] weight) -> float32 [M, 16 ceil(N / 16)]
Tensor bf16_blocks_mm(const Tensor& x, const Tensor& blocks) {
  TORCH_CHECK_TYPE(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "bfloat16 blocks take bfloat16 rows [M, K]");
  TORCH_CHECK_VALUE(blocks.dim() == 4 && blocks.size(2) == BLOCK_ROWS && blocks.size(3) == 2 &&
                        blocks.size(1) * 2 == x.size(1) && blocks.is_contiguous(),
                    "bfloat16 blocks must be [blocks, ", x.size(1) / 2, ", 16, 2], contiguous, not ", blocks.sizes());
  TORCH_CHECK_TYPE(blocks.scalar_type() == at::kBFloat16, "bfloat16 blocks must be bfloat16");
  const Tensor rows = x.contiguous();
  const int64_t m = rows.size(0), pairs = blocks.size(1), count = blocks.size(0), ldo = count * BLOCK_ROWS;
  Tensor out = at::empty({m, ldo}, rows.options().dtype(at::kFloat));
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(rows.data_ptr<at::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(blocks.data_ptr<at::BFloat16>());
  float* op = out.data_ptr<float>();
  parallel_claimed((count + BLOCKS_A_UNIT - 1) / BLOCKS_A_UNIT, [&](int64_t begin, int64_t end) {
    int64_t b = begin * BLOCKS_A_UNIT;
    const int64_t last = std::min(count, end * BLOCKS_A_UNIT);
#if defined(STUDIO_BF16_BLOCKS)
    // many rows: 4 blocks x 6 rows share each load; some: 2 x 12; a few: one block, its 16 rows in L1 between them
    const auto at_block = [&](int64_t block) { return wp + block * pairs * 32; };
    for (; m >= 24 && b + 4 <= last; b += 4) bf16_blocks_all_rows<4, 6>(xp, m, pairs, at_block(b), op, ldo, b * 16);
    for (; m >= 8 && b + 2 <= last; b += 2) bf16_blocks_all_rows<2, 12>(xp, m, pairs, at_block(b), op, ldo, b * 16);
    for (; b < last; ++b) bf16_blocks_all_rows<1, 8>(xp, m, pairs, at_block(b), op, ldo, b * 16);
#else
    for (; b < last; ++b) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < BLOCK_ROWS; ++r) {
          float sum = 0.0f;
          for (int64_t p = 0; p < pairs; ++p) {
            const uint16_t* pair = wp + ((b * pairs + p) * BLOCK_ROWS + r) * 2;
            const uint32_t v = xp[i * pairs + p];
            sum += c10::detail::f32_from_bits(pair[0]) * c10::detail::f32_from_bits(static_cast<uint16_t>(v));
            sum += c10::detail::f32_from_bits(pair[1]) * c10::detail::f32_from_bits(static_cast<uint16_t>(v >> 16));
          }
          op[i * ldo + b * BLOCK_ROWS + r] = sum;
        }
      }
    }
#endif
  });
  return out;
}

Tensor run_linear(const Linear& lin, const Tensor& x) {
  Tensor rows = x.scalar_type() == lin.input ? x : x.to(lin.input);
  Tensor out;
  if ((lin.kind == PACKED || lin.kind == DENSE) && x.size(0) <= lin.claimed_to) {
    out = dense_claimed_mm(rows, lin.kind == PACKED ? lin.b : lin.a);
  } else if (lin.kind == PACKED) {
    out = onednn_linear(rows, lin.a);
  } else if (lin.kind == BLOCKS) {
    out = bf16_blocks_mm(rows, lin.a);
  } else if (lin.kind == DENSE) {
    out = at::linear(rows, lin.a);
  } else if (lin.kind == INT8) {
    if (lin.acts_from > 0 && x.size(0) >= lin.acts_from && x.size(0) <= lin.acts_to) {
      out = int8_int8_activations_mm(rows, lin.a, lin.b, lin.amx_from > 0 && x.size(0) >= lin.amx_from);
    } else if (lin.tiles_from > 0 && x.size(0) >= lin.tiles_from) {
      out = int8_tiles_mm(rows, lin.a, lin.b, tiles_vnni());
    } else {
      out = at::_weight_int8pack_mm(rows, lin.a, lin.b);
    }
  } else if (lin.acts_from > 0 && x.size(0) >= lin.acts_from && x.size(0) <= lin.acts_to && lin.group == 32) {
    const bool amx = lin.amx_from > 0 && x.size(0) >= lin.amx_from;
    out = int4_int8_activations_mm(rows, lin.a, lin.b, lin.block, lin.split, amx);
  } else if (lin.tiles_from > 0 && x.size(0) >= lin.tiles_from && lin.group == 32) {
    out = int4_tiles_mm(rows, lin.a, lin.b, lin.block, lin.split, tiles_vnni());
  } else {
    out = at::_weight_int4pack_mm_for_cpu(rows, lin.a, lin.group, lin.b);
  }
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == lin.kernel_rows,
              "a linear kernel returned ", out.sizes(), " for ", x.size(0), " rows of ", lin.kernel_rows);
  if (lin.kernel_rows != lin.out_features) out = out.narrow(1, 0, lin.out_features);
  if (out.scalar_type() != at::kFloat) out = out.to(at::kFloat);
  if (lin.bias.defined()) out.add_(lin.bias);
  return out.is_contiguous() ? out : out.contiguous();
}

// One of a layer's four projections (qkv, o_proj, gate_up, down): one linear, or several side by side (each in its own
// format: a file stores some tensors in other formats) whose outputs are concatenated.
struct Projection {
  std::vector<Linear> parts;

  at::ScalarType input() const { return parts.front().input; }

  int64_t out_features() const {
    int64_t total = 0;
    for (const auto& part : parts) total += part.out_features;
    return total;
  }

  Tensor run(const Tensor& x) const {
    if (parts.size() == 1) return run_linear(parts.front(), x);
    std::vector<Tensor> outs;
    outs.reserve(parts.size());
    for (const auto& part : parts) outs.push_back(run_linear(part, x));
    return at::cat(outs, 1);
  }
};

// The weight tensors of one linear as its kind's kernel takes them, checked: (in_features, out_features)
std::pair<int64_t, int64_t> linear_shape(Kind kind, const Tensor& a, const Tensor& b, int64_t group) {
  if (kind == BLOCKS) {
    TORCH_CHECK_VALUE(a.defined() && a.device().is_cpu(), "bfloat16 blocks must be a CPU tensor");
    TORCH_CHECK_VALUE(a.dim() == 4 && a.size(2) == 16 && a.size(3) == 2 && a.is_contiguous(),
                      "bfloat16 blocks must be [blocks, K / 2, 16, 2], contiguous, not ", a.sizes());
    TORCH_CHECK_TYPE(a.scalar_type() == at::kBFloat16, "bfloat16 blocks must be bfloat16, not ", a.scalar_type());
    return {a.size(1) * 2, a.size(0) * 16};
  }
  TORCH_CHECK_VALUE(a.defined() && a.dim() == 2 && a.device().is_cpu(), "a linear's weight must be a 2-D CPU tensor");
  const int64_t n = a.size(0);
  if (kind == PACKED || kind == DENSE) {
    TORCH_CHECK_TYPE(a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16,
                     "a float weight must be float32 or bfloat16, not ", a.scalar_type());
    if (b.defined()) {  // a prepacked float32 weight's plain rows, for dense_claimed_mm
      TORCH_CHECK_VALUE(kind == PACKED && a.scalar_type() == at::kFloat,
                        "only a prepacked float32 weight has plain rows");
      check_rows(b, "a prepacked weight's plain rows", n, a.size(1), at::kFloat);
      TORCH_CHECK_VALUE(b.is_contiguous(), "a prepacked weight's plain rows must be contiguous");
    }
    return {a.size(1), n};
  }
  TORCH_CHECK_VALUE(b.defined() && b.device().is_cpu(), "a quantized linear needs its scales");
  if (kind == INT8) {
    TORCH_CHECK_TYPE(a.scalar_type() == at::kChar, "an int8 weight must be int8, not ", a.scalar_type());
    TORCH_CHECK_VALUE(b.dim() == 1 && b.size(0) == n, "int8 scales must be [", n, "], not ", b.sizes());
    TORCH_CHECK_VALUE(a.is_contiguous() && b.is_contiguous(), "int8 weights and scales must be contiguous");
    return {a.size(1), n};
  }
  TORCH_CHECK_TYPE(a.scalar_type() == at::kByte, "an int4 packed weight must be uint8, not ", a.scalar_type());
  TORCH_CHECK_VALUE(group > 0 && b.dim() == 3 && b.size(1) == n && b.size(2) == 2 && b.size(0) * group == 2 * a.size(1),
                    "int4 scales and zeros must be [in / group, ", n, ", 2] for group ", group, ", not ", b.sizes());
  TORCH_CHECK_VALUE(b.is_contiguous(), "int4 scales and zeros must be contiguous");
  return {2 * a.size(1), n};
}

// RMSNorm of every row of h [n, dim] into out (float32 or bfloat16), as torch computes it in float32:
// rstd = rsqrt(mean(h^2) + eps); out = (h * rstd) * w
void rms_norm(const float* h, const float* w, int64_t n, int64_t dim, double eps, Tensor& out) {
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = h + r * dim;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) ss += row[i] * row[i];
    const float rstd = 1.f / std::sqrt(ss / dim + static_cast<float>(eps));
    if (bf16) {
      auto* o = out.data_ptr<at::BFloat16>() + r * dim;
      for (int64_t i = 0; i < dim; ++i) o[i] = at::BFloat16((row[i] * rstd) * w[i]);
    } else {
      float* o = out.data_ptr<float>() + r * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[i] = (row[i] * rstd) * w[i];
    }
  }
}

// A float32 or bfloat16 output buffer, written element by element
struct Sink {
  float* f = nullptr;
  at::BFloat16* b = nullptr;
  explicit Sink(Tensor& out) {
    if (out.scalar_type() == at::kBFloat16) {
      b = out.data_ptr<at::BFloat16>();
    } else {
      f = out.data_ptr<float>();
    }
  }
  inline void put(int64_t index, float value) const {
    if (b) {
      b[index] = at::BFloat16(value);
    } else {
      f[index] = value;
    }
  }
};

// x * cos + rotate_half(x) * sin over one head's dim values
inline void rotary(const float* x, const float* cos, const float* sin, int64_t dim, float* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
  for (int64_t i = half; i < dim; ++i) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

// head_dim values into a KV slot of the cache's type (bfloat16 rounds to nearest even, as torch's .to() does)
template <typename T>
inline void store(const float* values, int64_t dim, T* out) {
  for (int64_t i = 0; i < dim; ++i) out[i] = static_cast<T>(values[i]);
}

struct DecodeModel : torch::CustomClassHolder {
  int64_t heads, kv_heads, head_dim, hidden_size, intermediate;
  double eps, scale;
  std::vector<Tensor> input_norm, post_norm;
  std::vector<int64_t> window;  // sliding window per layer, 0 for none
  std::vector<std::array<Projection, 4>> linears;  // qkv, o_proj, gate_up, down

  DecodeModel(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t hidden_size, int64_t intermediate, double eps,
              double scale)
      : heads(heads), kv_heads(kv_heads), head_dim(head_dim), hidden_size(hidden_size), intermediate(intermediate), eps(eps),
        scale(scale) {
    TORCH_CHECK_VALUE(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && head_dim % 2 == 0,
                      "heads must be a multiple of kv_heads, head_dim even");
    TORCH_CHECK_VALUE(hidden_size > 0 && intermediate > 0, "hidden and intermediate sizes must be positive");
  }

  // (in_features, out_features) of each slot: qkv, o_proj, gate_up, down
  std::array<std::pair<int64_t, int64_t>, 4> slot_shapes() const {
    const int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim;
    return {{{hidden_size, q_size + 2 * kv_size}, {q_size, hidden_size}, {hidden_size, 2 * intermediate},
             {intermediate, hidden_size}}};
  }

  void add_layer(Tensor in_norm, Tensor post, int64_t sliding_window) {
    for (const Tensor* norm : {&in_norm, &post}) {
      TORCH_CHECK_VALUE(norm->dim() == 1 && norm->size(0) == hidden_size && norm->device().is_cpu(),
                        "a norm weight must be [", hidden_size, "] on the CPU, not ", norm->sizes());
      TORCH_CHECK_TYPE(norm->scalar_type() == at::kFloat, "norm weights must be float32");
    }
    TORCH_CHECK_VALUE(sliding_window >= 0, "a sliding window can't be negative");
    input_norm.push_back(in_norm.contiguous());
    post_norm.push_back(post.contiguous());
    window.push_back(sliding_window);
    linears.emplace_back();
  }

  // Appends a linear to a projection of the last added layer (slot 0 qkv, 1 o_proj, 2 gate_up, 3 down): the slot's
  // linears compute its output side by side, in the order added. kind: a name of KINDS; out_features: the rows it
  // contributes (the first of what its kernel computes; int4 weights carry padding rows).
  void add_linear(int64_t slot, std::string kind, Tensor a, std::optional<Tensor> b, std::optional<Tensor> bias,
                  int64_t group, bool bfloat16_input, int64_t out_features) {
    TORCH_CHECK_VALUE(!linears.empty() && slot >= 0 && slot < 4, "add_linear: add a layer first; slot 0..3");
    Linear lin;
    lin.kind = kind_named(kind);
    lin.a = a;
    lin.b = b.has_value() ? *b : Tensor();
    lin.group = group;
    std::tie(lin.in_features, lin.kernel_rows) = linear_shape(lin.kind, lin.a, lin.b, group);
    TORCH_CHECK_VALUE(out_features > 0 && out_features <= lin.kernel_rows, "a linear of ", lin.kernel_rows,
                      " rows can't contribute ", out_features);
    lin.out_features = out_features;
    const auto expected_in = slot_shapes()[slot].first;
    TORCH_CHECK_VALUE(lin.in_features == expected_in, "a linear of slot ", slot, " takes ", expected_in,
                      " features, not ", lin.in_features);
    if (bias.has_value()) {
      lin.bias = bias->contiguous();
      TORCH_CHECK_VALUE(lin.bias.dim() == 1 && lin.bias.size(0) == lin.out_features && lin.bias.device().is_cpu(),
                        "a bias must be [", lin.out_features, "], not ", lin.bias.sizes());
      TORCH_CHECK_TYPE(lin.bias.scalar_type() == at::kFloat, "biases must be float32");
    }
    lin.input = bfloat16_input ? at::kBFloat16 : at::kFloat;
    TORCH_CHECK_TYPE(!(lin.kind == PACKED || lin.kind == DENSE) || lin.a.scalar_type() == lin.input,
                     "a float weight multiplies rows of its own dtype: ", lin.a.scalar_type(), " weight, ", lin.input,
                     " rows");
    linears.back()[slot].parts.push_back(lin);
  }

  // Steps of at least int4_from / int8_from rows (0: none) multiply those weights as bfloat16 tiles; int4 ones are
  // packed in blocks of `block` rows (`split`: a block's halves share bytes), as engine/model/int4pack.py found.
  void use_tiles(int64_t int4_from, int64_t int8_from, int64_t block, bool split) {
    TORCH_CHECK_VALUE(int4_from >= 0 && int8_from >= 0, "tiles start at a row count, or 0 for never");
    TORCH_CHECK_VALUE(int4_from == 0 || block == 32 || block == 64, "packing blocks are 32 or 64 rows, not ", block);
    for (auto& layer : linears) {
      for (auto& projection : layer) {
        for (auto& lin : projection.parts) {
          lin.tiles_from = lin.kind == INT4 ? int4_from : lin.kind == INT8 ? int8_from : 0;
          lin.block = block;
          lin.split = split;
        }
      }
    }
  }

  // Steps of `from` to `to` rows (from 0: none) multiply the int4 weights with rows of `in_features` inputs with int8
  // activations (int4_vnni_mm), from `amx_from` rows with AMX tiles (int4_amx_mm; 0: never); measured per input width,
  // which decides how a block's weights stay in cache.
  void use_vnni(int64_t in_features, int64_t from, int64_t to, int64_t amx_from) {
    TORCH_CHECK_VALUE(from >= 0 && (from == 0 || to >= from), "VNNI takes a range of row counts, or 0 for never");
    TORCH_CHECK_VALUE(from == 0 || int4_vnni(), "this build has no VNNI int4 products");
    TORCH_CHECK_VALUE(amx_from == 0 || (from > 0 && amx_from >= from && amx_from <= to),
                      "AMX tiles start within the range of row counts, or 0 for never");
    TORCH_CHECK_VALUE(amx_from == 0 || int4_amx(), "this CPU or build has no AMX int8 tiles");
    for (auto& layer : linears) {
      for (auto& projection : layer) {
        for (auto& lin : projection.parts) {
          if (lin.kind != INT4 || lin.in_features != in_features) continue;
          TORCH_CHECK_VALUE(from == 0 || lin.block > 0, "use_tiles sets the packing first");
          lin.acts_from = from;
          lin.acts_to = from ? to : 0;
          lin.amx_from = amx_from;
        }
      }
    }
  }

  // Steps of `from` to `to` rows (from 0: none) multiply the int8 weights with int8 activations, VNNI dot products
  // (int8_vnni_mm), from `amx_from` rows AMX tiles (int8_amx_mm; 0: never): the same floats; weights whose rows are not
  // groups of 32 inputs keep their route. Measured on the largest.
  void use_int8_activations(int64_t from, int64_t to, int64_t amx_from) {
    TORCH_CHECK_VALUE(from >= 0 && (from == 0 || to >= from), "int8 activations take a range of row counts, or 0");
    TORCH_CHECK_VALUE(amx_from == 0 || (from > 0 && amx_from >= from && amx_from <= to),
                      "AMX tiles start within the range of row counts, or 0 for never");
    TORCH_CHECK_VALUE(from == 0 || amx_from == from || int4_vnni(), "this build has no VNNI int8 products");
    TORCH_CHECK_VALUE(amx_from == 0 || int4_amx(), "this CPU or build has no AMX int8 tiles");
    for (auto& layer : linears) {
      for (auto& projection : layer) {
        for (auto& lin : projection.parts) {
          if (lin.kind != INT8 || lin.in_features % 32 != 0) continue;
          lin.acts_from = from;
          lin.acts_to = from ? to : 0;
          lin.amx_from = amx_from;
        }
      }
    }
  }

  // Steps of at most `to` rows (0: none) multiply the float32 and bfloat16 weights that have plain rows (dense ones,
  // prepacked ones given theirs) by dense_claimed_mm instead of oneDNN / at::linear; returns how many linears take it.
  int64_t use_claimed(int64_t to) {
    TORCH_CHECK_VALUE(to >= 0, "claimed products take steps of up to a row count, or 0 for none");
    int64_t count = 0;
    for (auto& layer : linears) {
      for (auto& projection : layer) {
        for (auto& lin : projection.parts) {
          const bool plain = (lin.kind == PACKED && lin.b.defined()) || lin.kind == DENSE;
          lin.claimed_to = plain ? to : 0;
          count += plain ? 1 : 0;
        }
      }
    }
    return count;
  }

  // Every layer has all four projections, each as wide as the model's shape says.
  void check_layers() const {
    TORCH_CHECK_VALUE(!linears.empty(), "the compiled step has no layers");
    const auto shapes = slot_shapes();
    for (size_t layer = 0; layer < linears.size(); ++layer) {
      for (size_t slot = 0; slot < 4; ++slot) {
        const auto& projection = linears[layer][slot];
        TORCH_CHECK_VALUE(!projection.parts.empty(), "layer ", layer, " has no linear in slot ", slot);
        TORCH_CHECK_VALUE(projection.out_features() == shapes[slot].second, "layer ", layer, " slot ", slot,
                          " computes ", projection.out_features(), " features, not ", shapes[slot].second);
      }
    }
  }

  // The chunk table and page tables: every row of the step in exactly one chunk, in order; positions from 0; page
  // ids within the pool and every chunk's table long enough for its positions. Returns the longest context.
  int64_t check_chunks(const Tensor& chunks, const Tensor& pages, int64_t n, int64_t num_pages, int64_t page_size) const {
    TORCH_CHECK_VALUE(chunks.dim() == 2 && chunks.size(1) == CHUNK_COLUMNS, "the chunk table must be [chunks, ",
                      static_cast<int64_t>(CHUNK_COLUMNS), "], not ", chunks.sizes());
    TORCH_CHECK_VALUE(pages.dim() == 2 && pages.size(0) == chunks.size(0) && pages.size(1) > 0,
                      "the page tables must be [", chunks.size(0), ", pages], not ", pages.sizes());
    TORCH_CHECK_TYPE(chunks.scalar_type() == at::kLong && pages.scalar_type() == at::kLong,
                     "the chunk and page tables must be int64");
    TORCH_CHECK_VALUE(chunks.device().is_cpu() && pages.device().is_cpu(), "the tables must be on the CPU");
    const int64_t* chunk = chunks.data_ptr<int64_t>();
    const int64_t* table = pages.data_ptr<int64_t>();
    const int64_t max_pages = pages.size(1);
    int64_t row = 0, longest = 0;
    for (int64_t c = 0; c < chunks.size(0); ++c) {
      const int64_t* meta = chunk + c * CHUNK_COLUMNS;
      const int64_t first = meta[FIRST_ROW], rows = meta[ROWS], start = meta[START];
      TORCH_CHECK_VALUE(first == row && rows > 0 && first + rows <= n, "chunk ", c, " covers rows [", first, ", ",
                        first + rows, "); the chunks must cover the step's ", n, " rows in order");
      TORCH_CHECK_VALUE(start >= 0, "chunk ", c, " starts at position ", start);
      TORCH_CHECK_VALUE((start + rows + page_size - 1) / page_size <= max_pages, "chunk ", c,
                        "'s page table is too short for position ", start + rows - 1);
      row += rows;
      longest = std::max(longest, start + rows);
    }
    TORCH_CHECK_VALUE(row == n, "the chunks cover ", row, " of the step's ", n, " rows");
    for (int64_t i = 0; i < pages.numel(); ++i) {
      TORCH_CHECK_VALUE(table[i] >= 0 && table[i] < num_pages, "page id ", table[i], " outside the pool of ", num_pages);
    }
    return longest;
  }

  // One long chunk (a prompt) over its pages with SDPA, as the Python layers do: causal over the chunk, and over
  // the cached tokens before it; a sliding window masks what lies beyond it.
  void attend_long(const Tensor& layer_cache, const int64_t* meta, const Tensor& table, const Tensor& q_rot,
                   int64_t sliding, Tensor& attended) {
    const int64_t first = meta[FIRST_ROW], rows = meta[ROWS], start = meta[START], context = start + rows;
    const int64_t page_size = layer_cache.size(3);
    const int64_t used = (context + page_size - 1) / page_size;
    Tensor index = table.narrow(0, 0, used);
    auto gather = [&](int64_t which) {
      return layer_cache[which].index_select(1, index).view({1, kv_heads, used * page_size, head_dim})
          .narrow(2, 0, context);
    };
    Tensor keys = gather(0), values = gather(1);
    if (keys.scalar_type() != at::kFloat) {  // a 16-bit cache: SDPA over float32 queries takes float32 keys
      keys = keys.to(at::kFloat);
      values = values.to(at::kFloat);
    }
    Tensor q = q_rot.narrow(0, first, rows).view({rows, heads, head_dim}).transpose(0, 1).unsqueeze(0);
    std::optional<Tensor> mask;
    if (start > 0 || sliding > 0) {
      Tensor q_pos = at::arange(start, context, table.options()).unsqueeze(1);
      Tensor k_pos = at::arange(context, table.options()).unsqueeze(0);
      Tensor allowed = k_pos.le(q_pos);
      if (sliding > 0) allowed.logical_and_(k_pos.gt(q_pos - sliding));
      mask = allowed;
    }
    Tensor out = at::scaled_dot_product_attention(q, keys, values, mask, 0.0, !mask.has_value(), scale,
                                                  heads != kv_heads);
    attended.narrow(0, first, rows).copy_(out[0].transpose(0, 1).reshape({rows, heads * head_dim}));
  }

  // hidden [n, hidden] float32 (the embeddings), cos/sin [n, head_dim] float32, storage the KV pages
  // [layers, 2, kv_heads, pages, page_size, head_dim] float32 or bfloat16; chunks [c, CHUNK_COLUMNS] int64: (first
  // row, rows, first position) per sequence, rows in order; pages [c, max_pages] int64: each sequence's page table.
  // Every row attends causally to its sequence's earlier tokens and itself. Returns the last layer's hidden states,
  // then the arguments handed back as they came. Why: this torch keeps a tensor's Python object alive while C++ holds
  // a second reference (c10/util/intrusive_ptr.h, "PyObject preservation"), so dropping the last C++ one takes the
  // interpreter lock; dropped here, with the lock released for the step, each argument waited for whichever thread
  // held it (the window's UI thread, the server's event loop): 8 % of a 16-chat step in the window. Handed back, they
  // are let go after the call has taken the lock back.
  std::vector<Tensor> forward(Tensor hidden, Tensor cos, Tensor sin, Tensor storage, Tensor chunks, Tensor pages) {
    // every input checked here: a wrong table or shape must fail the call (the Python layers redo the step), never
    // write into another sequence's pages
    check_layers();
    TORCH_CHECK_VALUE(hidden.dim() == 2, "hidden must be [rows, ", hidden_size, "], not ", hidden.sizes());
    const int64_t n = hidden.size(0);
    check_rows(hidden, "hidden", n, hidden_size, at::kFloat);
    check_rows(cos, "cos", n, head_dim, at::kFloat);
    check_rows(sin, "sin", n, head_dim, at::kFloat);
    const int64_t layers = static_cast<int64_t>(linears.size());
    TORCH_CHECK_VALUE(storage.dim() == 6 && storage.size(0) == layers && storage.size(1) == 2 &&
                          storage.size(2) == kv_heads && storage.size(5) == head_dim,
                      "the KV storage must be [", layers, ", 2, ", kv_heads, ", pages, page_size, ", head_dim, "], not ",
                      storage.sizes());
    TORCH_CHECK_TYPE(storage.scalar_type() == at::kFloat || storage.scalar_type() == at::kBFloat16,
                     "the KV storage must be float32 or bfloat16, not ", storage.scalar_type());
    TORCH_CHECK_VALUE(storage.is_contiguous() && storage.device().is_cpu(), "the KV storage must be contiguous on the CPU");
    Step step{hidden.contiguous().clone(), cos.contiguous(), sin.contiguous(), storage, chunks.contiguous(),
              pages.contiguous()};
    step.longest = check_chunks(step.chunks, step.pages, n, storage.size(3), storage.size(4));
    if (storage.scalar_type() == at::kBFloat16) {
      run_layers<at::BFloat16>(step);
    } else {
      run_layers<float>(step);
    }
    return {step.hidden, hidden, cos, sin, storage, chunks, pages};
  }

  // One checked step's tensors
  struct Step {
    Tensor hidden, cos, sin, storage, chunks, pages;
    int64_t longest = 0;
  };

  template <typename T>
  void run_layers(Step& step) {
    const Tensor& hidden = step.hidden;
    const Tensor& storage = step.storage;
    const int64_t n = hidden.size(0), num_chunks = step.chunks.size(0), max_pages = step.pages.size(1);
    const int64_t page_size = storage.size(4);
    const int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim, group = heads / kv_heads;
    const int64_t longest = step.longest;
    const int64_t* chunk = step.chunks.data_ptr<int64_t>();
    const int64_t* table = step.pages.data_ptr<int64_t>();
    float* h = hidden.data_ptr<float>();
    T* cache = storage.data_ptr<T>();
    const int64_t layer_stride = storage.stride(0), kv_stride = storage.stride(1), head_stride = storage.stride(2);
    const int64_t page_stride = storage.stride(3);
    std::vector<int64_t> row_chunk(n), row_pos(n);
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t* meta = chunk + c * CHUNK_COLUMNS;
      for (int64_t i = 0; i < meta[ROWS]; ++i) {
        row_chunk[meta[FIRST_ROW] + i] = c;
        row_pos[meta[FIRST_ROW] + i] = meta[START] + i;
      }
    }
    const float* cs = step.cos.data_ptr<float>();
    const float* sn = step.sin.data_ptr<float>();
    Tensor q_rot = at::empty({n, q_size}, hidden.options());
    float* q = q_rot.data_ptr<float>();
    std::vector<float> rotated(head_dim);

    for (size_t layer = 0; layer < linears.size(); ++layer) {
      const auto& lin = linears[layer];
      T* layer_cache = cache + layer * layer_stride;
      auto slot = [&](int64_t which, int64_t head, int64_t pos, int64_t c) {
        const int64_t page = table[c * max_pages + pos / page_size];
        return layer_cache + which * kv_stride + head * head_stride + page * page_stride + (pos % page_size) * head_dim;
      };

      Tensor x = at::empty({n, hidden_size}, hidden.options().dtype(lin[0].input()));
      rms_norm(h, input_norm[layer].data_ptr<float>(), n, hidden_size, eps, x);
      Tensor qkv = lin[0].run(x);
      const float* qkv_p = qkv.data_ptr<float>();
      const int64_t width = qkv.size(1);
      for (int64_t r = 0; r < n; ++r) {
        const float* row = qkv_p + r * width;
        const float* rc = cs + r * head_dim;
        const float* rs = sn + r * head_dim;
        for (int64_t hh = 0; hh < heads; ++hh) rotary(row + hh * head_dim, rc, rs, head_dim, q + r * q_size + hh * head_dim);
        for (int64_t kh = 0; kh < kv_heads; ++kh) {
          rotary(row + q_size + kh * head_dim, rc, rs, head_dim, rotated.data());
          store(rotated.data(), head_dim, slot(0, kh, row_pos[r], row_chunk[r]));
          store(row + q_size + kv_size + kh * head_dim, head_dim, slot(1, kh, row_pos[r], row_chunk[r]));
        }
      }

      Tensor attended = at::empty({n, q_size}, hidden.options().dtype(lin[1].input()));
      const Sink attended_out(attended);
      const int64_t sliding = window[layer];
      at::parallel_for(0, num_chunks * kv_heads, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores(longest), acc(head_dim);
        for (int64_t job = begin; job < end; ++job) {
          const int64_t c = job / kv_heads, kh = job % kv_heads;
          const int64_t* meta = chunk + c * CHUNK_COLUMNS;
          const int64_t first = meta[FIRST_ROW], rows = meta[ROWS], start = meta[START];
          if (rows > LOOP_ROWS) continue;
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t pos = start + i;
            const int64_t lo = sliding > 0 ? std::max<int64_t>(0, pos + 1 - sliding) : 0;
            for (int64_t g = 0; g < group; ++g) {
              const int64_t head = kh * group + g;
              const float* qh = q + (first + i) * q_size + head * head_dim;
              float top = -INFINITY;
              for (int64_t t = lo; t <= pos; ++t) {
                const T* k = slot(0, kh, t, c);
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * static_cast<float>(k[d]);
                scores[t] = dot * static_cast<float>(scale);
                top = std::max(top, scores[t]);
              }
              float total = 0.f;
              for (int64_t t = lo; t <= pos; ++t) {
                scores[t] = std::exp(scores[t] - top);
                total += scores[t];
              }
              std::fill(acc.begin(), acc.end(), 0.f);
              for (int64_t t = lo; t <= pos; ++t) {
                const T* v = slot(1, kh, t, c);
                const float p = scores[t] / total;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * static_cast<float>(v[d]);
              }
              const int64_t base = (first + i) * q_size + head * head_dim;
              for (int64_t d = 0; d < head_dim; ++d) attended_out.put(base + d, acc[d]);
            }
          }
        }
      });

      for (int64_t c = 0; c < num_chunks; ++c) {
        const int64_t* meta = chunk + c * CHUNK_COLUMNS;
        if (meta[ROWS] > LOOP_ROWS) attend_long(storage[layer], meta, step.pages[c], q_rot, sliding, attended);
      }

      Tensor o = lin[1].run(attended);
      const float* o_p = o.data_ptr<float>();
#pragma omp simd
      for (int64_t i = 0; i < n * hidden_size; ++i) h[i] += o_p[i];

      Tensor x2 = at::empty({n, hidden_size}, hidden.options().dtype(lin[2].input()));
      rms_norm(h, post_norm[layer].data_ptr<float>(), n, hidden_size, eps, x2);
      Tensor gate_up = lin[2].run(x2);
      // as the Python layers compute it (torch's vectorised SiLU), cast for the down projection's kernel
      Tensor act = at::silu(gate_up.narrow(1, 0, intermediate)).mul_(gate_up.narrow(1, intermediate, intermediate));
      if (lin[3].input() != at::kFloat) act = act.to(lin[3].input());
      Tensor down = lin[3].run(act);
      const float* d_p = down.data_ptr<float>();
#pragma omp simd
      for (int64_t i = 0; i < n * hidden_size; ++i) h[i] += d_p[i];
    }
  }
};

}  // namespace

TORCH_LIBRARY(studio, m) {
  m.class_<DecodeModel>("DecodeModel")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double>())
      .def("add_layer", &DecodeModel::add_layer)
      .def("add_linear", &DecodeModel::add_linear)
      .def("use_tiles", &DecodeModel::use_tiles)
      .def("use_vnni", &DecodeModel::use_vnni)
      .def("use_int8_activations", &DecodeModel::use_int8_activations)
      .def("use_claimed", &DecodeModel::use_claimed)
      .def("forward", &DecodeModel::forward);
  m.def("contract() -> str", &contract);
  m.def("tiles_vnni() -> bool", &tiles_vnni);
  m.def("dense_claimed_mm(Tensor x, Tensor w) -> Tensor", &dense_claimed_mm);
  m.def("bf16_blocks_built() -> bool", &bf16_blocks_built);
  m.def("bf16_blocks(Tensor w) -> Tensor", &bf16_blocks);
  m.def("bf16_blocks_mm(Tensor x, Tensor blocks) -> Tensor", &bf16_blocks_mm);
  m.def("int4_tiles_mm(Tensor x, Tensor packed, Tensor sz, int block, bool split, bool vnni) -> Tensor", &int4_tiles_mm);
  m.def("int8_tiles_mm(Tensor x, Tensor q, Tensor scale, bool vnni) -> Tensor", &int8_tiles_mm);
  m.def("int8_exact_mm(Tensor x, Tensor q, Tensor scale) -> Tensor", &int8_exact_mm);
  m.def("int4_exact_mm(Tensor x, Tensor packed, Tensor sz, int block, bool split) -> Tensor", &int4_exact_mm);
  m.def("int4_vnni() -> bool", &int4_vnni);
  m.def("int4_vnni_mm(Tensor x, Tensor packed, Tensor sz, int block, bool split) -> Tensor", &int4_vnni_mm);
  m.def("int4_amx() -> bool", &int4_amx);
  m.def("int4_amx_mm(Tensor x, Tensor packed, Tensor sz, int block, bool split) -> Tensor", &int4_amx_mm);
  m.def("int8_vnni_mm(Tensor x, Tensor q, Tensor scale) -> Tensor", &int8_vnni_mm);
  m.def("int8_amx_mm(Tensor x, Tensor q, Tensor scale) -> Tensor", &int8_amx_mm);
}
