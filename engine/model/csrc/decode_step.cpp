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
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

using at::Tensor;

namespace {

enum Kind : int64_t { PACKED = 0, INT8 = 1, INT4 = 2 };
constexpr int64_t LOOP_ROWS = 16;  // longer chunks (prompts) attend through SDPA's blocked kernels

struct Linear {
  int64_t kind = PACKED;
  Tensor a;      // the prepacked weight, the int8 weight, or the int4 packed weight
  Tensor b;      // int8 scales, or int4 scales and zeros
  Tensor bias;   // float32, or undefined
  int64_t group = 0;
  at::ScalarType input = at::kFloat;  // what the kernel multiplies: float32 or bfloat16 rows
};

Tensor onednn_linear(const Tensor& x, const Tensor& packed) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, c10::string_view,
                                     c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  return op.call(x, packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), c10::string_view(""));
}

// out[r, :] as float32, whatever the kernel returned
Tensor run_linear(const Linear& lin, const Tensor& x) {
  Tensor out;
  if (lin.kind == PACKED) {
    out = onednn_linear(x, lin.a);
  } else if (lin.kind == INT8) {
    out = at::_weight_int8pack_mm(x, lin.a, lin.b);
  } else {
    out = at::_weight_int4pack_mm_for_cpu(x, lin.a, lin.group, lin.b);
  }
  if (out.scalar_type() != at::kFloat) out = out.to(at::kFloat);
  if (lin.bias.defined()) out.add_(lin.bias);
  return out;
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

struct DecodeModel : torch::CustomClassHolder {
  int64_t heads, kv_heads, head_dim, hidden_size, intermediate;
  double eps, scale;
  std::vector<Tensor> input_norm, post_norm;
  std::vector<int64_t> window;  // sliding window per layer, 0 for none
  std::vector<std::array<Linear, 4>> linears;  // qkv, o_proj, gate_up, down

  DecodeModel(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t hidden_size, int64_t intermediate, double eps,
              double scale)
      : heads(heads), kv_heads(kv_heads), head_dim(head_dim), hidden_size(hidden_size), intermediate(intermediate), eps(eps),
        scale(scale) {}

  void add_layer(Tensor in_norm, Tensor post, int64_t sliding_window) {
    input_norm.push_back(in_norm.contiguous());
    post_norm.push_back(post.contiguous());
    window.push_back(sliding_window);
    linears.emplace_back();
  }

  // slot: 0 qkv, 1 o_proj, 2 gate_up, 3 down of the last added layer
  void set_linear(int64_t slot, int64_t kind, Tensor a, std::optional<Tensor> b, std::optional<Tensor> bias,
                  int64_t group, bool bfloat16_input) {
    TORCH_CHECK(!linears.empty() && slot >= 0 && slot < 4, "set_linear: add a layer first; slot 0..3");
    Linear& lin = linears.back()[slot];
    lin.kind = kind;
    lin.a = a;
    lin.b = b.has_value() ? *b : Tensor();
    lin.bias = bias.has_value() ? bias->contiguous() : Tensor();
    lin.group = group;
    lin.input = bfloat16_input ? at::kBFloat16 : at::kFloat;
  }

  // One long chunk (a prompt) over its pages with SDPA, as the Python layers do: causal over the chunk, and over
  // the cached tokens before it; a sliding window masks what lies beyond it.
  void attend_long(const Tensor& layer_cache, const int64_t* meta, const Tensor& table, const Tensor& q_rot,
                   int64_t sliding, Tensor& attended) {
    const int64_t first = meta[0], rows = meta[1], start = meta[2], context = start + rows;
    const int64_t page_size = layer_cache.size(3);
    const int64_t used = (context + page_size - 1) / page_size;
    Tensor index = table.narrow(0, 0, used);
    auto gather = [&](int64_t which) {
      return layer_cache[which].index_select(1, index).view({1, kv_heads, used * page_size, head_dim})
          .narrow(2, 0, context);
    };
    Tensor keys = gather(0), values = gather(1);
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
  // [layers, 2, kv_heads, pages, page_size, head_dim] float32; chunks [c, 3] int64: (first row, rows, first position)
  // per sequence, rows in order; pages [c, max_pages] int64: each sequence's page table. Every row attends causally
  // to its sequence's earlier tokens and itself. Returns the last layer's hidden states [n, hidden].
  Tensor forward(Tensor hidden, Tensor cos, Tensor sin, Tensor storage, Tensor chunks, Tensor pages) {
    TORCH_CHECK(hidden.scalar_type() == at::kFloat && storage.scalar_type() == at::kFloat, "float32 only");
    hidden = hidden.contiguous().clone();
    cos = cos.contiguous();
    sin = sin.contiguous();
    chunks = chunks.contiguous();
    pages = pages.contiguous();
    const int64_t n = hidden.size(0), num_chunks = chunks.size(0), max_pages = pages.size(1);
    const int64_t page_size = storage.size(4), num_pages = storage.size(3);
    const int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim, group = heads / kv_heads;
    const int64_t* chunk = chunks.data_ptr<int64_t>();
    const int64_t* table = pages.data_ptr<int64_t>();
    float* h = hidden.data_ptr<float>();
    float* cache = storage.data_ptr<float>();
    const int64_t layer_stride = storage.stride(0), kv_stride = storage.stride(1), head_stride = storage.stride(2);
    const int64_t page_stride = storage.stride(3);
    std::vector<int64_t> row_chunk(n), row_pos(n);
    int64_t longest = 0;
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t first = chunk[c * 3], rows = chunk[c * 3 + 1], start = chunk[c * 3 + 2];
      TORCH_CHECK(first >= 0 && first + rows <= n, "chunk rows out of range");
      TORCH_CHECK((start + rows + page_size - 1) / page_size <= max_pages, "page table too short");
      for (int64_t i = 0; i < rows; ++i) {
        row_chunk[first + i] = c;
        row_pos[first + i] = start + i;
      }
      longest = std::max(longest, start + rows);
    }
    for (int64_t i = 0; i < num_chunks * max_pages; ++i) TORCH_CHECK(table[i] >= 0 && table[i] < num_pages, "page id");
    const float* cs = cos.data_ptr<float>();
    const float* sn = sin.data_ptr<float>();
    Tensor q_rot = at::empty({n, q_size}, hidden.options());
    float* q = q_rot.data_ptr<float>();

    for (size_t layer = 0; layer < linears.size(); ++layer) {
      const auto& lin = linears[layer];
      float* layer_cache = cache + layer * layer_stride;
      auto slot = [&](int64_t which, int64_t head, int64_t pos, int64_t c) {
        const int64_t page = table[c * max_pages + pos / page_size];
        return layer_cache + which * kv_stride + head * head_stride + page * page_stride + (pos % page_size) * head_dim;
      };

      Tensor x = at::empty({n, hidden_size}, hidden.options().dtype(lin[0].input));
      rms_norm(h, input_norm[layer].data_ptr<float>(), n, hidden_size, eps, x);
      Tensor qkv = run_linear(lin[0], x);
      const float* qkv_p = qkv.data_ptr<float>();
      const int64_t width = qkv.size(1);
      for (int64_t r = 0; r < n; ++r) {
        const float* row = qkv_p + r * width;
        const float* rc = cs + r * head_dim;
        const float* rs = sn + r * head_dim;
        for (int64_t hh = 0; hh < heads; ++hh) rotary(row + hh * head_dim, rc, rs, head_dim, q + r * q_size + hh * head_dim);
        for (int64_t kh = 0; kh < kv_heads; ++kh) {
          rotary(row + q_size + kh * head_dim, rc, rs, head_dim, slot(0, kh, row_pos[r], row_chunk[r]));
          std::copy_n(row + q_size + kv_size + kh * head_dim, head_dim, slot(1, kh, row_pos[r], row_chunk[r]));
        }
      }

      Tensor attended = at::empty({n, q_size}, hidden.options().dtype(lin[1].input));
      const Sink attended_out(attended);
      const int64_t sliding = window[layer];
      at::parallel_for(0, num_chunks * kv_heads, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scores(longest), acc(head_dim);
        for (int64_t job = begin; job < end; ++job) {
          const int64_t c = job / kv_heads, kh = job % kv_heads;
          const int64_t first = chunk[c * 3], rows = chunk[c * 3 + 1], start = chunk[c * 3 + 2];
          if (rows > LOOP_ROWS) continue;
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t pos = start + i;
            const int64_t lo = sliding > 0 ? std::max<int64_t>(0, pos + 1 - sliding) : 0;
            for (int64_t g = 0; g < group; ++g) {
              const int64_t head = kh * group + g;
              const float* qh = q + (first + i) * q_size + head * head_dim;
              float top = -INFINITY;
              for (int64_t t = lo; t <= pos; ++t) {
                const float* k = slot(0, kh, t, c);
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * k[d];
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
                const float* v = slot(1, kh, t, c);
                const float p = scores[t] / total;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * v[d];
              }
              const int64_t base = (first + i) * q_size + head * head_dim;
              for (int64_t d = 0; d < head_dim; ++d) attended_out.put(base + d, acc[d]);
            }
          }
        }
      });

      for (int64_t c = 0; c < num_chunks; ++c) {
        const int64_t rows = chunk[c * 3 + 1];
        if (rows > LOOP_ROWS) attend_long(storage[layer], chunk + c * 3, pages[c], q_rot, sliding, attended);
      }

      Tensor o = run_linear(lin[1], attended);
      const float* o_p = o.data_ptr<float>();
#pragma omp simd
      for (int64_t i = 0; i < n * hidden_size; ++i) h[i] += o_p[i];

      Tensor x2 = at::empty({n, hidden_size}, hidden.options().dtype(lin[2].input));
      rms_norm(h, post_norm[layer].data_ptr<float>(), n, hidden_size, eps, x2);
      Tensor gate_up = run_linear(lin[2], x2);
      // as the Python layers compute it (torch's vectorised SiLU), cast for the down projection's kernel
      Tensor act = at::silu(gate_up.narrow(1, 0, intermediate)).mul_(gate_up.narrow(1, intermediate, intermediate));
      if (lin[3].input != at::kFloat) act = act.to(lin[3].input);
      Tensor down = run_linear(lin[3], act);
      const float* d_p = down.data_ptr<float>();
#pragma omp simd
      for (int64_t i = 0; i < n * hidden_size; ++i) h[i] += d_p[i];
    }
    return hidden;
  }
};

}  // namespace

TORCH_LIBRARY(studio, m) {
  m.class_<DecodeModel>("DecodeModel")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double>())
      .def("add_layer", &DecodeModel::add_layer)
      .def("set_linear", &DecodeModel::set_linear)
      .def("forward", &DecodeModel::forward);
}
