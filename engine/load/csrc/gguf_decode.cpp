// GGUF blocks straight into the engine's weight formats, one pass over the file's bytes per tensor.
//
// Why: the same work in torch ops (engine/load/gguf_blocks.py) makes about ten passes over every weight (nibbles,
// shifts, casts, concatenations, the packing's transposes), a few seconds per billion weights on two cores; here each
// row is decoded once into a small buffer and written where torch's kernels want it. The values are the torch path's
// bit for bit (same float32 operations in the same order, no fused multiply-adds: built with -ffp-contract=off), and
// the tests check that.
//
// Built at run time by engine/load/native.py (a C++ compiler, torch's headers); registered as torch.ops.studio_gguf.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using at::Tensor;

namespace {

// ggml's type ids (gguf's GGMLQuantizationType)
enum GgmlType : int64_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                          Q6_K = 14, BF16 = 30 };

struct BlockShape {
  int64_t values;
  int64_t bytes;
};

BlockShape block_shape(int64_t type) {
  switch (type) {
    case F32: return {1, 4};
    case F16: return {1, 2};
    case BF16: return {1, 2};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q5_1: return {32, 24};
    case Q8_0: return {32, 34};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    default: TORCH_CHECK_VALUE(false, "ggml type ", type, " has no decoder here");
  }
  return {0, 0};
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Q4_K/Q5_K: the 6-bit scale and minimum of sub-block j from the 12 packed bytes
inline void k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 0x3F;
    mn = s[j + 4] & 0x3F;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// one row of `blocks` blocks -> float32 values (the gguf package's operations, in its order)
void decode_row(int64_t type, const uint8_t* row, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    switch (type) {
      case F32: {
        std::memcpy(out + b, row + 4 * b, 4);
        break;
      }
      case F16: out[b] = half_at(row + 2 * b); break;
      case BF16: {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * b, 2);
        out[b] = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
        break;
      }
      case Q4_0: {
        const uint8_t* p = row + 18 * b;
        const float d = half_at(p);
        float* o = out + 32 * b;
        for (int i = 0; i < 16; ++i) {
          o[i] = d * static_cast<float>((p[2 + i] & 0x0F) - 8);
          o[i + 16] = d * static_cast<float>((p[2 + i] >> 4) - 8);
        }
        break;
      }
      case Q4_1: {
        const uint8_t* p = row + 20 * b;
        const float d = half_at(p), m = half_at(p + 2);
        float* o = out + 32 * b;
        for (int i = 0; i < 16; ++i) {
          o[i] = d * static_cast<float>(p[4 + i] & 0x0F) + m;
          o[i + 16] = d * static_cast<float>(p[4 + i] >> 4) + m;
        }
        break;
      }
      case Q5_0:
      case Q5_1: {
        const bool with_min = type == Q5_1;
        const uint8_t* p = row + (with_min ? 24 : 22) * b;
        const float d = half_at(p), m = with_min ? half_at(p + 2) : 0.0f;
        const uint8_t* qh = p + (with_min ? 4 : 2);
        const uint8_t* qs = qh + 4;
        float* o = out + 32 * b;
        for (int i = 0; i < 32; ++i) {
          const int low = i < 16 ? (qs[i] & 0x0F) : (qs[i - 16] >> 4);
          const int q = low | (((qh[i / 8] >> (i % 8)) & 1) << 4);
          o[i] = with_min ? d * static_cast<float>(q) + m : d * static_cast<float>(q - 16);
        }
        break;
      }
      case Q8_0: {
        const uint8_t* p = row + 34 * b;
        const float d = half_at(p);
        float* o = out + 32 * b;
        for (int i = 0; i < 32; ++i) o[i] = static_cast<float>(static_cast<int8_t>(p[2 + i])) * d;
        break;
      }
      case Q4_K:
      case Q5_K: {
        const bool five = type == Q5_K;
        const uint8_t* p = row + (five ? 176 : 144) * b;
        const float d = half_at(p), dmin = half_at(p + 2);
        const uint8_t* scales = p + 4;
        const uint8_t* qh = p + 16;
        const uint8_t* qs = p + (five ? 48 : 16);
        float* o = out + 256 * b;
        for (int j = 0; j < 8; ++j) {
          int sc, mn;
          k_scale_min(scales, j, sc, mn);
          const float dd = d * static_cast<float>(sc), dm = dmin * static_cast<float>(mn);
          const uint8_t* q = qs + 32 * (j / 2);
          for (int i = 0; i < 32; ++i) {
            int value = (j % 2 == 0) ? (q[i] & 0x0F) : (q[i] >> 4);
            if (five) value |= ((qh[i] >> j) & 1) << 4;
            o[32 * j + i] = dd * static_cast<float>(value) - dm;
          }
        }
        break;
      }
      case Q6_K: {  // ggml's reference order: per 128 weights, four runs of 32 from ql's nibbles and qh's bit pairs
        const uint8_t* p = row + 210 * b;
        const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192);
        const float d = half_at(p + 208);
        float scale[16];
        for (int i = 0; i < 16; ++i) scale[i] = d * static_cast<float>(scales[i]);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = p + 64 * h;
          const uint8_t* qh = p + 128 + 32 * h;
          float* o = out + 256 * b + 128 * h;
          const float* s = scale + 8 * h;
          for (int half = 0; half < 2; ++half) {  // a scale per 16 weights: constant in each inner loop, which vectorizes
            const float s1 = s[half], s2 = s[half + 2], s3 = s[half + 4], s4 = s[half + 6];
            for (int l = 16 * half; l < 16 * half + 16; ++l) {
              const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
              const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
              const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
              const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
              o[l] = s1 * static_cast<float>(q1);
              o[l + 32] = s2 * static_cast<float>(q2);
              o[l + 64] = s3 * static_cast<float>(q3);
              o[l + 96] = s4 * static_cast<float>(q4);
            }
          }
        }
        break;
      }
      default: TORCH_CHECK_VALUE(false, "ggml type ", type, " has no decoder here");
    }
  }
}

// One row of Q4_0/Q4_1/Q4_K -> its 4-bit codes (0..15) and each group of 32's scale and zero, w = (q - 8) * s + z
void int4_row(int64_t type, const uint8_t* row, int64_t blocks, uint8_t* codes, float* scale, float* zero) {
  for (int64_t b = 0; b < blocks; ++b) {
    if (type == Q4_K) {
      const uint8_t* p = row + 144 * b;
      const float d = half_at(p), dmin = half_at(p + 2);
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        k_scale_min(p + 4, j, sc, mn);
        const float s = d * static_cast<float>(sc);
        scale[8 * b + j] = s;
        zero[8 * b + j] = 8.0f * s - dmin * static_cast<float>(mn);
        const uint8_t* q = p + 16 + 32 * (j / 2);
        uint8_t* c = codes + 256 * b + 32 * j;
        for (int i = 0; i < 32; ++i) c[i] = (j % 2 == 0) ? (q[i] & 0x0F) : (q[i] >> 4);
      }
      continue;
    }
    const bool with_min = type == Q4_1;
    const uint8_t* p = row + (with_min ? 20 : 18) * b;
    const float d = half_at(p);
    scale[b] = d;
    zero[b] = with_min ? half_at(p + 2) + 8.0f * d : 0.0f;
    const uint8_t* qs = p + (with_min ? 4 : 2);
    uint8_t* c = codes + 32 * b;
    for (int i = 0; i < 16; ++i) {
      c[i] = qs[i] & 0x0F;
      c[i + 16] = qs[i] >> 4;
    }
  }
}

void check_raw(const Tensor& raw, int64_t type) {
  TORCH_CHECK_VALUE(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.device().is_cpu(),
                    "raw rows must be a contiguous uint8 [rows, bytes] tensor on the CPU");
  const auto shape = block_shape(type);
  TORCH_CHECK_VALUE(raw.size(1) % shape.bytes == 0, "rows of ", raw.size(1), " bytes are not whole blocks");
}

int64_t columns_of(const Tensor& raw, int64_t type) {
  const auto shape = block_shape(type);
  return raw.size(1) / shape.bytes * shape.values;
}

// [rows, bytes] -> float32 [rows, columns]
Tensor dequantize(const Tensor& raw, int64_t type) {
  check_raw(raw, type);
  const int64_t rows = raw.size(0), columns = columns_of(raw, type), blocks = raw.size(1) / block_shape(type).bytes;
  Tensor out = at::empty({rows, columns}, at::kFloat);
  const uint8_t* in = raw.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  const int64_t stride = raw.size(1);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) decode_row(type, in + r * stride, blocks, o + r * columns);
  });
  return out;
}

// c10::BFloat16(x)'s bits (round to nearest even; NaN to its canonical 0x7FC0), without branches: a row's loop of them
// vectorizes
inline uint16_t bfloat16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const auto rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  return x != x ? uint16_t{0x7FC0} : rounded;
}

// The smallest bfloat16 >= x (x > 0): a scale rounded up, so codes against it never leave their range
inline c10::BFloat16 bfloat16_up(float x) {
  c10::BFloat16 rounded(x);  // round to nearest even, as torch's .to(bfloat16)
  if (static_cast<float>(rounded) < x) rounded.x = static_cast<uint16_t>(rounded.x + 1);
  return rounded;
}

// max |v|: sixteen running maxima side by side (one lane each: vectorized), then their max; one running maximum
// was a chain of dependent max instructions, the slowest part of requantizing a row
inline float largest_magnitude(const float* values, int64_t count) {
  float lanes[16] = {};
  const int64_t whole = count / 16 * 16;
  for (int64_t c = 0; c < whole; c += 16) {
    for (int i = 0; i < 16; ++i) lanes[i] = std::max(lanes[i], std::fabs(values[c + i]));
  }
  float largest = 0.0f;
  for (float lane : lanes) largest = std::max(largest, lane);
  for (int64_t c = whole; c < count; ++c) largest = std::max(largest, std::fabs(values[c]));
  return largest;
}

// [rows, bytes] -> (q int8 [rows, columns], scale bfloat16 [rows]): symmetric int8 per row, as
// engine/model/quantized.py's int8_rows_from_float, written into q and scales (contiguous: a tensor of their own, or
// rows of a joint buffer)
void int8_rows_to(const Tensor& raw, int64_t type, Tensor& q, Tensor& scales) {
  const int64_t rows = raw.size(0), columns = columns_of(raw, type), blocks = raw.size(1) / block_shape(type).bytes;
  const uint8_t* in = raw.data_ptr<uint8_t>();
  int8_t* qo = q.data_ptr<int8_t>();
  c10::BFloat16* so = scales.data_ptr<c10::BFloat16>();
  const int64_t stride = raw.size(1);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> values(columns);
    for (int64_t r = begin; r < end; ++r) {
      decode_row(type, in + r * stride, blocks, values.data());
      const float largest = largest_magnitude(values.data(), columns);
      const c10::BFloat16 scale = bfloat16_up(std::max(largest, 1e-12f) / 127.0f);
      const float s = static_cast<float>(scale);
      so[r] = scale;
      // locals the compiler can see are not written through `out`: the loop then vectorizes (IEEE division and
      // round-half-even, as torch's, so the codes stay the torch path's bit for bit)
      int8_t* __restrict out = qo + r * columns;
      const float* __restrict value = values.data();
      const int64_t count = columns;
      for (int64_t c = 0; c < count; ++c) {
        const float code = std::nearbyint(value[c] / s);
        out[c] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, code)));
      }
    }
  });
}

std::tuple<Tensor, Tensor> int8_rows(const Tensor& raw, int64_t type) {
  check_raw(raw, type);
  Tensor q = at::empty({raw.size(0), columns_of(raw, type)}, at::kChar);
  Tensor scales = at::empty({raw.size(0)}, at::kBFloat16);
  int8_rows_to(raw, type, q, scales);
  return {q, scales};
}

void int8_rows_into(const Tensor& raw, int64_t type, Tensor q, Tensor scales) {
  check_raw(raw, type);
  const int64_t rows = raw.size(0), columns = columns_of(raw, type);
  TORCH_CHECK_VALUE(q.dim() == 2 && q.size(0) == rows && q.size(1) == columns && q.scalar_type() == at::kChar &&
                        q.is_contiguous(),
                    "int8 codes go into a contiguous int8 [", rows, ", ", columns, "] tensor, not ", q.sizes());
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.size(0) == rows && scales.scalar_type() == at::kBFloat16 &&
                        scales.is_contiguous(),
                    "their scales go into a contiguous bfloat16 [", rows, "] tensor, not ", scales.sizes());
  int8_rows_to(raw, type, q, scales);
}

// tile[i] holds bytes (i, 0..7) of an 8x8 byte matrix (byte c at bits 8c: little-endian, as x86 and arm64 are);
// afterwards tile[c] holds bytes (0..7, c): the transpose, by swapping 4x4, then 2x2, then 1x1 blocks
inline void transpose8x8(uint64_t* tile) {
  for (int i = 0; i < 4; ++i) {
    const uint64_t t = ((tile[i] >> 32) ^ tile[i + 4]) & 0x00000000FFFFFFFFull;
    tile[i + 4] ^= t;
    tile[i] ^= t << 32;
  }
  for (int i : {0, 1, 4, 5}) {
    const uint64_t t = ((tile[i] >> 16) ^ tile[i + 2]) & 0x0000FFFF0000FFFFull;
    tile[i + 2] ^= t;
    tile[i] ^= t << 16;
  }
  for (int i : {0, 2, 4, 6}) {
    const uint64_t t = ((tile[i] >> 8) ^ tile[i + 1]) & 0x00FF00FF00FF00FFull;
    tile[i + 1] ^= t;
    tile[i] ^= t << 8;
  }
}

// Q4_0/Q4_1/Q4_K [rows, bytes] -> torch's packed int4 weight for this CPU's layout (rows padded to 16: code 8, scale
// and zero 0) and its scales_and_zeros, bfloat16 [columns / 32, padded rows, 2]. Layout (engine/model/int4pack.py):
// blocks of `block` rows; in a full block byte [k, j] holds rows j and j + block/2 when `split`, else rows 2j and 2j+1,
// as every shorter block does.
// into packed [padded, columns / 2] (contiguous) and sz [groups, padded, 2] whose groups lie `group_stride` values
// apart (2 * padded for a tensor of its own; more for these rows of a joint buffer's)
void int4_pack_to(const Tensor& raw, int64_t type, int64_t block, bool split, Tensor& packed, Tensor& sz) {
  const int64_t rows = raw.size(0), columns = columns_of(raw, type), blocks = raw.size(1) / block_shape(type).bytes;
  const int64_t padded = rows + (16 - rows % 16) % 16, groups = columns / 32, group_stride = sz.stride(0);
  const uint8_t* in = raw.data_ptr<uint8_t>();
  uint8_t* po = packed.data_ptr<uint8_t>();
  c10::BFloat16* zo = sz.data_ptr<c10::BFloat16>();
  const int64_t stride = raw.size(1), full = padded / block * block, units = full / block + (padded > full ? 1 : 0);
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(block * columns);
    std::vector<float> scale(groups), zero(groups);
    // the unit's (scale, zero) bfloat16 pairs, a row's groups side by side
    std::vector<uint32_t> scale_zero(block * groups);
    std::vector<const uint8_t*> low_rows(block / 2), high_rows(block / 2);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t first = unit * block, count = std::min(block, padded - first);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = first + i;
        uint8_t* c = codes.data() + i * columns;
        if (r < rows) {
          int4_row(type, in + r * stride, blocks, c, scale.data(), zero.data());
        } else {
          std::fill(c, c + columns, uint8_t{8});
          std::fill(scale.begin(), scale.end(), 0.0f);
          std::fill(zero.begin(), zero.end(), 0.0f);
        }
        uint32_t* __restrict row_pairs = scale_zero.data() + i * groups;
        const float* __restrict s = scale.data();
        const float* __restrict z = zero.data();
        for (int64_t g = 0; g < groups; ++g) row_pairs[g] = bfloat16_bits(s[g]) | uint32_t{bfloat16_bits(z[g])} << 16;
      }
      // then group by group, the unit's rows side by side as the layout keeps them (one scattered store per value,
      // each converted on its own, took a third of the packing's time)
      for (int64_t g = 0; g < groups; ++g) {
        c10::BFloat16* to = zo + g * group_stride + first * 2;
        for (int64_t i = 0; i < count; ++i) std::memcpy(to + 2 * i, &scale_zero[i * groups + g], 4);
      }
      const int64_t half = count / 2;  // a multiple of 8: rows are padded to 16
      uint8_t* dst = po + first * (columns / 2);
      const bool pairs = !(split && count == block);
      for (int64_t j = 0; j < half; ++j) {  // byte j's rows, worked out once a unit rather than once a byte
        low_rows[j] = codes.data() + (pairs ? 2 * j : j) * columns;
        high_rows[j] = codes.data() + (pairs ? 2 * j + 1 : j + half) * columns;
      }
      // out[k][j] = codes[low(j)][k] | codes[high(j)][k] << 4, eight by eight: a byte-at-a-time loop read two codes
      // 32-64 rows apart for every byte it wrote and took over half of the load's packing time
      for (int64_t j = 0; j < half; j += 8) {
        const uint8_t* const* low = low_rows.data() + j;
        const uint8_t* const* high = high_rows.data() + j;
        for (int64_t k = 0; k < columns; k += 8) {
          uint64_t tile[8];
          for (int64_t i = 0; i < 8; ++i) {
            uint64_t lo, hi;
            std::memcpy(&lo, low[i] + k, 8);
            std::memcpy(&hi, high[i] + k, 8);
            tile[i] = lo | (hi << 4);  // codes are 0..15: no nibble spills into the next byte
          }
          transpose8x8(tile);
          uint8_t* out = dst + k * half + j;
          for (int64_t c = 0; c < 8; ++c) std::memcpy(out + c * half, &tile[c], 8);
        }
      }
    }
  });
}

void check_int4(const Tensor& raw, int64_t type, int64_t block) {
  TORCH_CHECK_VALUE(type == Q4_0 || type == Q4_1 || type == Q4_K, "only Q4_0, Q4_1 and Q4_K keep their codes");
  TORCH_CHECK_VALUE(block == 32 || block == 64, "packing blocks are 32 or 64 rows, not ", block);
  check_raw(raw, type);
}

std::tuple<Tensor, Tensor> int4_pack(const Tensor& raw, int64_t type, int64_t block, bool split) {
  check_int4(raw, type, block);
  const int64_t rows = raw.size(0), columns = columns_of(raw, type), padded = rows + (16 - rows % 16) % 16;
  Tensor packed = at::empty({padded, columns / 2}, at::kByte);
  Tensor sz = at::empty({columns / 32, padded, 2}, at::kBFloat16);
  int4_pack_to(raw, type, block, split, packed, sz);
  return {packed, sz};
}

// The same packing written into rows of a joint buffer: packed [padded, columns / 2] contiguous, sz [groups, padded,
// 2] with rows of 2 values (a slice along its rows of a [groups, more rows, 2] tensor)
void int4_pack_into(const Tensor& raw, int64_t type, int64_t block, bool split, Tensor packed, Tensor sz) {
  check_int4(raw, type, block);
  const int64_t rows = raw.size(0), columns = columns_of(raw, type), padded = rows + (16 - rows % 16) % 16;
  TORCH_CHECK_VALUE(packed.dim() == 2 && packed.size(0) == padded && packed.size(1) == columns / 2 &&
                        packed.scalar_type() == at::kByte && packed.is_contiguous(),
                    "the packing goes into a contiguous uint8 [", padded, ", ", columns / 2, "] tensor, not ",
                    packed.sizes());
  TORCH_CHECK_VALUE(sz.dim() == 3 && sz.size(0) == columns / 32 && sz.size(1) == padded && sz.size(2) == 2 &&
                        sz.scalar_type() == at::kBFloat16 && sz.stride(2) == 1 && sz.stride(1) == 2 &&
                        sz.stride(0) >= 2 * padded,
                    "scales and zeros go into a bfloat16 [", columns / 32, ", ", padded, ", 2] slice of rows, not ",
                    sz.sizes(), " with strides ", sz.strides());
  int4_pack_to(raw, type, block, split, packed, sz);
}

// Rows [row0, row0 + rows) of a weight in torch's int4 packing (int4_pack's layout above) -> bfloat16 [rows, K],
// w = (code - 8) * scale + zero in float32, rounded once. row0 and rows are whole packing blocks (the last may be
// shorter). Why: torch's int4 kernel costs as much per row however many rows share the weight (16 rows 8x one row,
// 640 rows 300x); a prompt's rows multiply a tile of this bfloat16 weight through oneDNN instead.
Tensor int4_unpack(const Tensor& packed, const Tensor& sz, int64_t block, bool split, int64_t row0, int64_t rows) {
  TORCH_CHECK_VALUE(block == 32 || block == 64, "packing blocks are 32 or 64 rows, not ", block);
  TORCH_CHECK_VALUE(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
                    "the packed weight must be a contiguous uint8 [rows, K / 2] tensor");
  const int64_t padded = packed.size(0), columns = packed.size(1) * 2, groups = columns / 32;
  TORCH_CHECK_VALUE(columns % 32 == 0 && padded % 16 == 0, "a packing of ", packed.sizes(), " is not whole groups");
  TORCH_CHECK_VALUE(sz.dim() == 3 && sz.size(0) == groups && sz.size(1) == padded && sz.size(2) == 2 &&
                        sz.scalar_type() == at::kBFloat16 && sz.is_contiguous(),
                    "scales and zeros must be a contiguous bfloat16 [K / 32, rows, 2] tensor, not ", sz.sizes());
  TORCH_CHECK_VALUE(row0 >= 0 && rows > 0 && row0 + rows <= padded && row0 % block == 0 &&
                        (rows % block == 0 || row0 + rows == padded),
                    "rows ", row0, "..", row0 + rows, " are not whole packing blocks of ", padded);
  Tensor out = at::empty({rows, columns}, at::kBFloat16);
  const uint8_t* pi = packed.data_ptr<uint8_t>();
  const c10::BFloat16* zi = sz.data_ptr<c10::BFloat16>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  const int64_t full = padded / block * block;
  const int64_t units = (rows + block - 1) / block;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(block * columns);  // the unit's codes, row-major: the nibbles untangled first
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t first = row0 + unit * block, count = std::min(block, padded - first);
      const int64_t half = count / 2;
      const bool pairs = !(split && count == block && first < full);
      const uint8_t* src = pi + first * (columns / 2);
      for (int64_t k = 0; k < columns; k += 8) {
        for (int64_t j = 0; j < half; j += 8) {
          uint64_t tile[8];
          for (int64_t c = 0; c < 8; ++c) std::memcpy(&tile[c], src + (k + c) * half + j, 8);
          transpose8x8(tile);  // tile[i]: the bytes of pair j + i at columns k..k+7
          for (int64_t i = 0; i < 8; ++i) {
            const int64_t low = pairs ? 2 * (j + i) : j + i, high = pairs ? 2 * (j + i) + 1 : j + i + half;
            const uint64_t lo = tile[i] & 0x0F0F0F0F0F0F0F0Full, hi = (tile[i] >> 4) & 0x0F0F0F0F0F0F0F0Full;
            std::memcpy(codes.data() + low * columns + k, &lo, 8);
            std::memcpy(codes.data() + high * columns + k, &hi, 8);
          }
        }
      }
      for (int64_t i = 0; i < count; ++i) {  // each row: its groups of 32, contiguous (vectorized)
        const int64_t r = first + i;
        const uint8_t* c = codes.data() + i * columns;
        c10::BFloat16* dst = o + (r - row0) * columns;
        for (int64_t g = 0; g < groups; ++g) {
          const float s = static_cast<float>(zi[(g * padded + r) * 2]);
          const float z = static_cast<float>(zi[(g * padded + r) * 2 + 1]);
          uint16_t* d = reinterpret_cast<uint16_t*>(dst + 32 * g);
          for (int b = 0; b < 32; ++b) {  // round to nearest even, as c10::BFloat16 does for finite values
            const float v = static_cast<float>(static_cast<int>(c[32 * g + b]) - 8) * s + z;
            uint32_t bits;
            std::memcpy(&bits, &v, 4);
            d[b] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
          }
        }
      }
    }
  });
  return out;
}

std::string version() { return "gguf_decode 6"; }

}  // namespace

TORCH_LIBRARY(studio_gguf, m) {
  m.def("version", &version);
  m.def("dequantize", &dequantize);
  m.def("int8_rows", &int8_rows);
  m.def("int4_pack", &int4_pack);
  m.def("int4_pack_into(Tensor raw, int type, int block, bool split, Tensor(a!) packed, Tensor(b!) sz) -> ()",
        &int4_pack_into);
  m.def("int8_rows_into(Tensor raw, int type, Tensor(a!) q, Tensor(b!) scales) -> ()", &int8_rows_into);
  m.def("int4_unpack", &int4_unpack);
}
