// Native execution of a TT linear layer's contraction plan: one forward and one backward op, and the
// forward of each side alone for a fused block that recomputes it (comera/feedforward.py).
//
// The C++ counterpart of comera/kernels.py (plan execution) and of comera/tt.py's gate products
// (gated_cores, core_and_gate_grads), step for step: the same ATen ops in the same order, so results equal
// the Python path's. The ops are registered as
//
//   comera_native::tt_forward(x, bias, cores, gates, m, left_groups, right_groups, dense, fold_bias)
//       -> [y, saved...]
//   comera_native::tt_backward(dy, x, cores, gates, saved, m, left_groups, right_groups, dense,
//       fold_bias, has_bias, need_dx, need_dbias) -> [dx, dbias, dcores..., dgates...]
//   comera_native::tt_left_forward(x, cores, m, left_groups) -> [left blocks..., left outputs...]
//   comera_native::tt_right_forward(z, bias, cores, m, right_groups, fold_bias)
//       -> [y, right blocks..., right activations...]
//
// "saved" holds only tensors the forward created: the d - 1 gated cores, the merged blocks (input side,
// then output side), then the activations (each input group's output, the last z; the output groups'
// inputs after the first, or [z | 1] with a folded bias) or, dense, W. The backward rebuilds every view
// of x and of the cores from the plan. The side forwards take all d gated cores and return their side's
// part of "saved". dx and dbias are empty tensors when not wanted. comera/native.py builds and loads this
// file.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

namespace {

using at::Tensor;
using std::vector;

// ---------------------------------------------------------------------------------------------------
// Products. Large float32 CPU products go to oneDNN's inner product X @ W^T (mkldnn::_linear_pointwise),
// as comera.kernels does (INNER_PRODUCT_MIN_MACS there; keep the two in step).

constexpr int64_t kNarrowMinMacs = int64_t(1) << 22;  // products with at most 64 output columns
constexpr int64_t kWideMinMacs = int64_t(1) << 25;

using InnerProductFn = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, c10::string_view,
                              c10::List<std::optional<c10::Scalar>>, std::optional<c10::string_view>);

// The inner product's handle, or nullopt where this build has none.
const std::optional<c10::TypedOperatorHandle<InnerProductFn>>& inner_product_op() {
  static const std::optional<c10::TypedOperatorHandle<InnerProductFn>> op =
      []() -> std::optional<c10::TypedOperatorHandle<InnerProductFn>> {
    if (!at::hasMKLDNN()) return std::nullopt;
    try {
      auto handle = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
      if (!handle) return std::nullopt;
      return handle->typed<InnerProductFn>();
    } catch (const c10::Error&) {
      return std::nullopt;
    }
  }();
  return op;
}

bool inner_product_fits(const Tensor& a, const Tensor& w, int64_t cols, const std::optional<Tensor>& bias) {
  if (!inner_product_op() || a.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat ||
      !a.device().is_cpu())
    return false;
  if (a.size(0) * a.size(1) * cols < (cols > 64 ? kWideMinMacs : kNarrowMinMacs)) return false;
  if (bias && !(bias->scalar_type() == at::kFloat && bias->is_contiguous())) return false;
  return a.is_contiguous() && !(at::GradMode::is_enabled() && (a.requires_grad() || w.requires_grad()));
}

// a @ w^T (+ bias) by oneDNN, or an undefined tensor when it cannot run here (the caller then uses mm).
Tensor inner_product(const Tensor& a, const Tensor& w, const std::optional<Tensor>& bias) {
  try {
    return inner_product_op()->call(a, w, bias, "none", c10::List<std::optional<c10::Scalar>>(),
                                    c10::string_view(""));
  } catch (const c10::Error&) {
    return Tensor();
  }
}

// a @ b (+ bias).
Tensor product(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias = std::nullopt) {
  if (inner_product_fits(a, b, b.size(1), bias)) {
    Tensor out = inner_product(a, b.t(), bias);
    if (out.defined()) return out;
  }
  return bias ? at::addmm(*bias, a, b) : at::mm(a, b);
}

// a @ w^T.
Tensor product_t(const Tensor& a, const Tensor& w) {
  if (inner_product_fits(a, w, w.size(0), std::nullopt)) {
    Tensor out = inner_product(a, w, std::nullopt);
    if (out.defined()) return out;
  }
  return at::mm(a, w.t());
}

Tensor rows(const Tensor& t, int64_t count) {
  return (t.dim() == 2 && t.size(0) == count) ? t : t.reshape({count, -1});
}

// ---------------------------------------------------------------------------------------------------
// Core merges. A chain holds a group's blocks and the 2-D core matrices the merge multiplied; "fresh"
// are the blocks made by products (the ones the forward returns for the backward).

struct Chain {
  vector<Tensor> blocks, mats;
};

// Left to right: blocks K|k (r_a n_a..n_k, r_{k+1}); the last is the group's block. Fresh: blocks[1:].
Chain merge_left(const vector<Tensor>& cores, const vector<Tensor>* fresh = nullptr) {
  Chain c;
  c.blocks.push_back(cores[0].reshape({-1, cores[0].size(-1)}));
  for (size_t i = 1; i < cores.size(); ++i) {
    const Tensor& h = cores[i];
    Tensor mat = h.reshape({h.size(0), -1});
    c.blocks.push_back(fresh ? (*fresh)[i - 1] : at::mm(c.blocks.back(), mat).view({-1, h.size(-1)}));
    c.mats.push_back(mat);
  }
  return c;
}

vector<Tensor> merge_left_backward(Tensor dblock, const vector<Tensor>& cores, const Chain& c) {
  vector<Tensor> grads(cores.size());
  for (size_t i = cores.size() - 1; i > 0; --i) {
    Tensor d = dblock.reshape({c.blocks[i - 1].size(0), -1});
    grads[i] = at::mm(c.blocks[i - 1].t(), d).view(cores[i].sizes());
    dblock = at::mm(d, c.mats[i - 1].t());
  }
  grads[0] = dblock.reshape(cores[0].sizes());
  return grads;
}

// Right to left: blocks K|k (r_k, n_k..n_{b-1} r_b); the first is the group's block. Fresh: blocks[:-1].
Chain merge_right(const vector<Tensor>& cores, const vector<Tensor>* fresh = nullptr) {
  const size_t k = cores.size();
  Chain c;
  c.blocks.resize(k);
  c.mats.resize(k - 1);
  c.blocks[k - 1] = cores[k - 1].reshape({cores[k - 1].size(0), -1});
  for (size_t i = k - 1; i-- > 0;) {
    const Tensor& h = cores[i];
    c.mats[i] = h.reshape({-1, h.size(-1)});
    c.blocks[i] = fresh ? (*fresh)[i] : at::mm(c.mats[i], c.blocks[i + 1]).view({h.size(0), -1});
  }
  return c;
}

vector<Tensor> merge_right_backward(Tensor dblock, const vector<Tensor>& cores, const Chain& c) {
  vector<Tensor> grads(cores.size());
  for (size_t i = 0; i + 1 < cores.size(); ++i) {
    Tensor d = dblock.reshape({c.mats[i].size(0), -1});
    grads[i] = at::mm(d, c.blocks[i + 1].t()).view(cores[i].sizes());
    dblock = at::mm(c.mats[i].t(), d);
  }
  grads.back() = dblock.reshape(cores.back().sizes());
  return grads;
}

// ---------------------------------------------------------------------------------------------------
// The plan.

struct Span {
  int64_t a, b;
};

vector<Span> spans_of(c10::IntArrayRef groups, int64_t offset) {
  vector<Span> out;
  for (int64_t size : groups) {
    out.push_back({offset, offset + size});
    offset += size;
  }
  return out;
}

vector<Tensor> slice(const vector<Tensor>& v, int64_t a, int64_t b) {
  return vector<Tensor>(v.begin() + a, v.begin() + b);
}

// H_k = G_k * g_k (the last core has no gate).
vector<Tensor> gated(at::TensorList cores, at::TensorList gates) {
  vector<Tensor> eff = at::_foreach_mul(cores.slice(0, cores.size() - 1), gates);
  eff.push_back(cores.back());
  return eff;
}

// What a left group's absorption reads: z (x, or the previous group's output) laid out for its block.
Tensor left_input(const Tensor& z, const Tensor& block, bool last, int64_t tokens) {
  if (last) return rows(z, tokens);
  if (tokens == 1) return rows(z, block.size(0));
  return z.view({tokens, block.size(0), -1});
}

// dK = Z^T dz of the last input group, contiguous (as comera.kernels: transposed product + copy on CPU).
Tensor input_block_grad(const Tensor& zin, const Tensor& dz) {
  if (zin.device().is_cpu() && zin.size(0) > 1) return at::t_copy(at::mm(dz.t(), zin));
  return at::mm(zin.t(), dz);
}

// One side's forward: its output, the blocks its merges made and the activations tt_backward reads.
struct Side {
  Tensor out;
  vector<Tensor> blocks, acts;
};

// Input side z = x A, group by group (comera.kernels.left_forward). acts: each group's output, the last z.
Side left_forward(const Tensor& x, const vector<Tensor>& eff, int64_t m, c10::IntArrayRef groups) {
  const int64_t tokens = x.size(0);
  Side side{x, {}, {}};
  for (const Span& s : spans_of(groups, 0)) {
    Chain c = merge_left(slice(eff, s.a, s.b));
    const Tensor& block = c.blocks.back();
    Tensor zin = left_input(side.out, block, s.b == m, tokens);
    if (s.b == m)
      side.out = product(zin, block);
    else if (tokens == 1)
      side.out = at::mm(block.t(), zin);
    else
      side.out = at::matmul(block.t(), zin);
    side.blocks.insert(side.blocks.end(), c.blocks.begin() + 1, c.blocks.end());
    side.acts.push_back(side.out);
  }
  return side;
}

// Output side y = z B + b (comera.kernels.right_forward). acts: the inputs of the groups after the first,
// or [z | 1] when the bias is folded in.
Side right_forward(const Tensor& z, const std::optional<Tensor>& bias, const vector<Tensor>& eff, int64_t m,
                   c10::IntArrayRef groups, bool fold_bias) {
  const int64_t tokens = z.size(0);
  const vector<Span> spans = spans_of(groups, m);
  Side side{z, {}, {}};
  for (size_t g = 0; g < spans.size(); ++g) {
    Chain c = merge_right(slice(eff, spans[g].a, spans[g].b));
    const Tensor& block = c.blocks[0];
    side.blocks.insert(side.blocks.end(), c.blocks.begin(), c.blocks.end() - 1);
    if (spans.size() == 1 && bias) {
      if (fold_bias) {
        Tensor z1 = at::pad(z, {0, 1}, "constant", 1.0);
        side.acts.push_back(z1);
        side.out = product_t(z1, at::cat({block.t(), bias->unsqueeze(1)}, 1));
      } else {
        side.out = product(z, block, bias);
      }
      break;
    }
    if (g > 0) side.acts.push_back(side.out);
    side.out = product(rows(side.out, side.out.numel() / block.size(0)), block);
    if (g + 1 == spans.size()) {
      side.out = rows(side.out, tokens);
      if (bias) side.out.add_(*bias);
    }
  }
  return side;
}

void append(vector<Tensor>& out, const vector<Tensor>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

vector<Tensor> tt_forward(const Tensor& x, const std::optional<Tensor>& bias, at::TensorList cores,
                          at::TensorList gates, int64_t m, c10::IntArrayRef left_groups,
                          c10::IntArrayRef right_groups, bool dense, bool fold_bias) {
  const int64_t d = cores.size();
  vector<Tensor> eff = gated(cores, gates);
  vector<Tensor> out(1);
  out.insert(out.end(), eff.begin(), eff.end() - 1);
  if (dense) {
    Chain left = merge_left(slice(eff, 0, m)), right = merge_right(slice(eff, m, d));
    Tensor weight = at::mm(left.blocks.back(), right.blocks[0]);
    out[0] = bias ? at::addmm(*bias, x, weight) : at::mm(x, weight);
    out.insert(out.end(), left.blocks.begin() + 1, left.blocks.end());
    out.insert(out.end(), right.blocks.begin(), right.blocks.end() - 1);
    out.push_back(weight);
    return out;
  }
  Side left = left_forward(x, eff, m, left_groups);
  Side right = right_forward(left.out, bias, eff, m, right_groups, fold_bias);
  out[0] = right.out;
  append(out, left.blocks);
  append(out, right.blocks);
  append(out, left.acts);
  append(out, right.acts);
  return out;
}

vector<Tensor> tt_left_forward(const Tensor& x, at::TensorList cores, int64_t m, c10::IntArrayRef left_groups) {
  Side left = left_forward(x, cores.vec(), m, left_groups);
  vector<Tensor> out = left.blocks;
  append(out, left.acts);
  return out;
}

vector<Tensor> tt_right_forward(const Tensor& z, const std::optional<Tensor>& bias, at::TensorList cores,
                                int64_t m, c10::IntArrayRef right_groups, bool fold_bias) {
  Side right = right_forward(z, bias, cores.vec(), m, right_groups, fold_bias);
  vector<Tensor> out{right.out};
  append(out, right.blocks);
  append(out, right.acts);
  return out;
}

vector<Tensor> tt_backward(const Tensor& dy_in, const Tensor& x, at::TensorList cores, at::TensorList gates,
                           at::TensorList saved, int64_t m, c10::IntArrayRef left_groups,
                           c10::IntArrayRef right_groups, bool dense, bool fold_bias, bool has_bias,
                           bool need_dx, bool need_dbias) {
  const int64_t d = cores.size(), tokens = x.size(0);
  Tensor dbias = (has_bias && need_dbias && !fold_bias) ? dy_in.sum(0) : Tensor();
  vector<Tensor> eff(saved.begin(), saved.begin() + (d - 1));
  eff.push_back(cores.back());
  int64_t next = d - 1;
  auto take = [&](int64_t count) {
    vector<Tensor> v(saved.begin() + next, saved.begin() + next + count);
    next += count;
    return v;
  };
  Tensor dx;
  vector<Tensor> d_eff;
  if (dense) {
    vector<Tensor> left_cores = slice(eff, 0, m), right_cores = slice(eff, m, d);
    vector<Tensor> lf = take(m - 1), rf = take(d - m - 1);
    Chain left = merge_left(left_cores, &lf), right = merge_right(right_cores, &rf);
    Tensor weight = take(1)[0];
    Tensor dweight = at::mm(x.t(), dy_in);
    if (need_dx) dx = at::mm(dy_in, weight.t());
    Tensor da = at::mm(dweight, right.blocks[0].t()), db = at::mm(left.blocks.back().t(), dweight);
    d_eff = merge_left_backward(da, left_cores, left);
    vector<Tensor> dr = merge_right_backward(db, right_cores, right);
    d_eff.insert(d_eff.end(), dr.begin(), dr.end());
  } else {
    const vector<Span> lspans = spans_of(left_groups, 0), rspans = spans_of(right_groups, m);
    vector<Chain> lchains, rchains;
    for (const Span& s : lspans) {
      vector<Tensor> f = take(s.b - s.a - 1);
      lchains.push_back(merge_left(slice(eff, s.a, s.b), &f));
    }
    for (const Span& s : rspans) {
      vector<Tensor> f = take(s.b - s.a - 1);
      rchains.push_back(merge_right(slice(eff, s.a, s.b), &f));
    }
    vector<Tensor> louts = take(lspans.size());
    const bool folded = fold_bias && has_bias && rspans.size() == 1;
    vector<Tensor> racts = take(folded ? 1 : rspans.size() - 1);
    const Tensor& z = louts.back();
    // Output side.
    vector<Tensor> d_right(d - m);
    Tensor dy = dy_in;
    for (size_t g = rspans.size(); g-- > 0;) {
      const Span& s = rspans[g];
      const Tensor& block = rchains[g].blocks[0];
      Tensor yin;
      if (folded)
        yin = racts[0];
      else if (g == 0)
        yin = z;
      else
        yin = rows(racts[g - 1], racts[g - 1].numel() / block.size(0));
      dy = rows(dy, yin.size(0));
      Tensor dblock = at::mm(yin.t(), dy);
      if (yin.size(1) > block.size(0)) {  // folded bias: the last row is db
        Tensor db = dblock.select(0, -1);
        dblock = dblock.slice(0, 0, -1);
        if (need_dbias) dbias = db;
      }
      dy = product_t(dy, block);
      vector<Tensor> grads = merge_right_backward(dblock, slice(eff, s.a, s.b), rchains[g]);
      std::copy(grads.begin(), grads.end(), d_right.begin() + (s.a - m));
    }
    Tensor dz = rows(dy, folded ? racts[0].size(0) : z.size(0));
    // Input side.
    vector<Tensor> d_left(m);
    for (size_t g = lspans.size(); g-- > 0;) {
      const Span& s = lspans[g];
      const Tensor& block = lchains[g].blocks.back();
      const bool last = s.b == m;
      Tensor zin = left_input(g == 0 ? x : louts[g - 1], block, last, tokens);
      const bool wanted = g > 0 || need_dx;
      Tensor dblock, dzin;
      if (last) {
        dz = rows(dz, tokens);
        dblock = input_block_grad(zin, dz);
        if (wanted) dzin = product_t(dz, block);
      } else if (tokens == 1) {
        dz = rows(dz, block.size(1));
        dblock = at::mm(zin, dz.t());
        if (wanted) dzin = at::mm(block, dz);
      } else {
        dz = dz.view({tokens, block.size(1), -1});
        dblock = at::einsum("tcs,tbs->cb", {zin, dz});
        if (wanted) dzin = at::matmul(block, dz);
      }
      vector<Tensor> grads = merge_left_backward(dblock, slice(eff, s.a, s.b), lchains[g]);
      std::copy(grads.begin(), grads.end(), d_left.begin() + s.a);
      dz = dzin;
    }
    if (need_dx) dx = rows(dz, tokens);
    d_eff = d_left;
    d_eff.insert(d_eff.end(), d_right.begin(), d_right.end());
  }
  // Cores and gates from the effective cores' gradients.
  vector<Tensor> d_gated(d_eff.begin(), d_eff.end() - 1);
  // Not wanted: an empty tensor (a Tensor[] cannot hold None when a dispatch mode hands it back).
  vector<Tensor> out{dx.defined() ? dx : dy_in.new_empty({0}), dbias.defined() ? dbias : dy_in.new_empty({0})};
  vector<Tensor> d_cores = at::_foreach_mul(d_gated, gates);
  out.insert(out.end(), d_cores.begin(), d_cores.end());
  out.push_back(d_eff.back());
  for (const Tensor& p : at::_foreach_mul(d_gated, cores.slice(0, d - 1))) out.push_back(p.sum(at::IntArrayRef{0, 1}));
  return out;
}

}  // namespace

TORCH_LIBRARY(comera_native, lib) {
  lib.def("tt_forward(Tensor x, Tensor? bias, Tensor[] cores, Tensor[] gates, int m, int[] left_groups, "
          "int[] right_groups, bool dense, bool fold_bias) -> Tensor[]");
  lib.def("tt_backward(Tensor dy, Tensor x, Tensor[] cores, Tensor[] gates, Tensor[] saved, int m, "
          "int[] left_groups, int[] right_groups, bool dense, bool fold_bias, bool has_bias, bool need_dx, "
          "bool need_dbias) -> Tensor[]");
  lib.def("tt_left_forward(Tensor x, Tensor[] cores, int m, int[] left_groups) -> Tensor[]");
  lib.def("tt_right_forward(Tensor z, Tensor? bias, Tensor[] cores, int m, int[] right_groups, bool fold_bias) "
          "-> Tensor[]");
}

TORCH_LIBRARY_IMPL(comera_native, CompositeExplicitAutograd, lib) {
  lib.impl("tt_forward", &tt_forward);
  lib.impl("tt_backward", &tt_backward);
  lib.impl("tt_left_forward", &tt_left_forward);
  lib.impl("tt_right_forward", &tt_right_forward);
}
