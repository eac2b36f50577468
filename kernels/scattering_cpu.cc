// The scattering transform's forward pass (kernels/scattering.h): every 2-D DFT of a chunk of
// signals is two Eigen GEMMs with a per-signal transpose between them, so a chunk's transforms
// run as a few large products. Compiled once per CPU instruction set (kernels/cpu_isa_variant.h).
#include "kernels/cpu_isa_variant.h"
#include "kernels/scattering.h"

#if HUDDLE_CPU_ISA_DISPATCH

namespace huddle::kernels {

HUDDLE_CPU_ISA_DECLARE(ScatteringForward);

void ScatteringForward(const ScatteringPlan& plan, const float* in, int64_t count, float* out) {
  HUDDLE_CPU_ISA_CALL(ScatteringForward, plan, in, count, out);
}

}  // namespace huddle::kernels

#else  // the variant of one instruction set

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

namespace huddle::kernels::HUDDLE_CPU_ISA_VARIANT {
namespace {

using Cf = std::complex<float>;
using FMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using FMap = Eigen::Map<FMatrix>;
using ConstFMap = Eigen::Map<const FMatrix>;

// Signals transformed together: large enough for GEMM-sized products, small enough for cache, and
// fewer for large grids so that the scratch stays within kScratchBytes (or one signal's worth).
constexpr int64_t kChunk = 64;
constexpr int64_t kScratchBytes = int64_t{32} << 20;

// Per signal, [rows][cols] -> [cols][rows].
void TransposeBlocks(const Cf* in, int64_t signals, int64_t rows, int64_t cols, Cf* out) {
  for (int64_t s = 0; s < signals; ++s) {
    const Cf* a = in + s * rows * cols;
    Cf* b = out + s * rows * cols;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) b[c * rows + r] = a[r * cols + c];
    }
  }
}

class Transformer {
 public:
  Transformer(const ScatteringPlan& plan, int64_t max_signals) : plan_(plan) {
    const auto size = static_cast<size_t>(max_signals * plan.padded_h * plan.padded_w);
    for (std::vector<Cf>* b : {&a_, &b_, &x0_, &u2_}) b->resize(size);
    real_.resize(size);
    u1_.resize(static_cast<size_t>(plan.shape.scales * plan.shape.angles) * size);
  }

  // Transforms `signals` (<= max_signals) single-channel signals x[signal][height][width] into
  // out[signal][path][out_h][out_w].
  void Run(const float* x, int64_t signals, float* out) {
    signals_ = signals;
    const ScatteringPlan& p = plan_;
    const int64_t J = p.shape.scales, L = p.shape.angles;
    const int64_t u1_size = signals * p.padded_h * p.padded_w;
    Pad(x);
    Forward(real_.data(), 0, x0_.data());
    int64_t path = 0;
    Output(x0_.data(), 0, p.phi[0], J, out, path++);
    // Order 1: the DFT of |x * psi_{j1,t1}| at resolution j1, kept for order 2.
    for (int64_t n1 = 0; n1 < J * L; ++n1) {
      const int64_t j1 = n1 / L;
      Cf* u1 = u1_.data() + n1 * u1_size;
      Filter(x0_.data(), 0, p.psi[static_cast<size_t>(n1)][0], j1);
      InverseModulus(j1);
      Forward(real_.data(), j1, u1);
      Output(u1, j1, p.phi[static_cast<size_t>(j1)], J - j1, out, path++);
    }
    // Order 2, after every order-1 path (kymatio's channel order).
    for (int64_t n1 = 0; n1 < J * L; ++n1) {
      const int64_t j1 = n1 / L;
      const Cf* u1 = u1_.data() + n1 * u1_size;
      for (int64_t n2 = (j1 + 1) * L; n2 < J * L; ++n2) {
        const int64_t j2 = n2 / L;
        Filter(u1, j1, p.psi[static_cast<size_t>(n2)][static_cast<size_t>(j1)], j2 - j1);
        InverseModulus(j2);
        Forward(real_.data(), j2, u2_.data());
        Output(u2_.data(), j2, p.phi[static_cast<size_t>(j2)], J - j2, out, path++);
      }
    }
  }

 private:
  int64_t rows(int64_t r) const { return plan_.padded_h >> r; }
  int64_t cols(int64_t r) const { return plan_.padded_w >> r; }

  // real_ = the signals reflect-padded (no edge repeat) to the padded grid.
  void Pad(const float* x) {
    const ScatteringPlan& p = plan_;
    const int64_t h = p.shape.height, w = p.shape.width, m = p.padded_h, n = p.padded_w;
    auto reflect = [](int64_t i, int64_t size) {
      if (i < 0) return -i;
      if (i >= size) return 2 * (size - 1) - i;
      return i;
    };
    for (int64_t s = 0; s < signals_; ++s) {
      const float* src = x + s * h * w;
      float* dst = real_.data() + s * m * n;
      for (int64_t r = 0; r < m; ++r) {
        const int64_t sr = reflect(r - p.pad_top, h);
        for (int64_t c = 0; c < n; ++c) dst[r * n + c] = src[sr * w + reflect(c - p.pad_left, w)];
      }
    }
  }

  // out ([signal][cols][rows], transposed) = the DFT of the real signals `x` ([signal][rows][cols])
  // at resolution r: x F_cols, transposed per signal, times F_rows.
  void Forward(const float* x, int64_t r, Cf* out) {
    const int64_t m = rows(r), n = cols(r);
    Product(x, signals_ * m, n, plan_.dft_w_real[static_cast<size_t>(r)], 2 * n, a_.data());
    TransposeBlocks(a_.data(), signals_, m, n, b_.data());
    Product(b_.data(), signals_ * n, 2 * m, plan_.dft_h[static_cast<size_t>(r)], 2 * m, out);
  }

  // out[rows][cols] = in[rows][inner] f[inner][cols], over floats (complex arrays interleaved).
  static void Product(const void* in, int64_t rows, int64_t inner, const std::vector<float>& f,
                      int64_t cols, void* out) {
    FMap(static_cast<float*>(out), rows, cols).noalias() =
        ConstFMap(static_cast<const float*>(in), rows, inner) * ConstFMap(f.data(), inner, cols);
  }

  // a_ ([signal][cols][rows] at resolution r + k) = the product of the Fourier arrays `f` at
  // resolution r with `filter` (same layout), subsampled by 2^k in space: the mean over the
  // 2^k x 2^k aliases.
  void Filter(const Cf* f, int64_t r, const std::vector<float>& filter, int64_t k) {
    const int64_t m = rows(r), n = cols(r), mo = m >> k, no = n >> k, step = int64_t{1} << k;
    const float* w = filter.data();
    if (k == 0) {  // no subsampling: an elementwise product
      for (int64_t s = 0; s < signals_; ++s) {
        const auto* src = reinterpret_cast<const float*>(f + s * m * n);
        auto* o = reinterpret_cast<float*>(a_.data() + s * m * n);
        for (int64_t i = 0; i < m * n; ++i) {
          o[2 * i] = src[2 * i] * w[i];
          o[2 * i + 1] = src[2 * i + 1] * w[i];
        }
      }
      return;
    }
    const float scale = 1.0f / static_cast<float>(step * step);
    for (int64_t s = 0; s < signals_; ++s) {
      const auto* src = reinterpret_cast<const float*>(f + s * m * n);
      auto* o = reinterpret_cast<float*>(a_.data() + s * mo * no);
      for (int64_t b = 0; b < no; ++b) {
        for (int64_t a = 0; a < mo; ++a) {
          float re = 0, im = 0;
          for (int64_t q = 0; q < step; ++q) {
            for (int64_t p = 0; p < step; ++p) {
              const int64_t i = (b + q * no) * m + a + p * mo;
              re += src[2 * i] * w[i];
              im += src[2 * i + 1] * w[i];
            }
          }
          o[2 * (b * mo + a)] = re * scale;
          o[2 * (b * mo + a) + 1] = im * scale;
        }
      }
    }
  }

  // Inverse DFT of a_ ([signal][cols][rows] at resolution r): Y^T G_rows, transposed per signal,
  // times G_cols; leaves the complex result in a_ ([signal][rows][cols]).
  void Inverse(int64_t r) {
    const int64_t m = rows(r), n = cols(r);
    Product(a_.data(), signals_ * n, 2 * m, plan_.idft_h[static_cast<size_t>(r)], 2 * m, b_.data());
    TransposeBlocks(b_.data(), signals_, n, m, a_.data());
    Product(a_.data(), signals_ * m, 2 * n, plan_.idft_w[static_cast<size_t>(r)], 2 * n, b_.data());
    std::swap(a_, b_);
  }

  // real_ = |inverse DFT of a_| at resolution r.
  void InverseModulus(int64_t r) {
    Inverse(r);
    const int64_t size = signals_ * rows(r) * cols(r);
    const auto* z = reinterpret_cast<const float*>(a_.data());
    float* out = real_.data();
    for (int64_t i = 0; i < size; ++i) {
      out[i] = std::sqrt(z[2 * i] * z[2 * i] + z[2 * i + 1] * z[2 * i + 1]);
    }
  }

  // Writes path `path`: `f` (resolution r) times phi at r, subsampled by 2^k to resolution J,
  // inverse-transformed, real part, cropped by one on each side.
  void Output(const Cf* f, int64_t r, const std::vector<float>& phi, int64_t k, float* out,
              int64_t path) {
    const ScatteringPlan& p = plan_;
    const int64_t J = p.shape.scales;
    Filter(f, r, phi, k);
    Inverse(J);
    const int64_t n = cols(J), oh = p.out_h, ow = p.out_w;
    for (int64_t s = 0; s < signals_; ++s) {
      const Cf* src = a_.data() + s * rows(J) * n;
      float* dst = out + (s * p.paths + path) * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) dst[i * ow + j] = src[(i + 1) * n + j + 1].real();
      }
    }
  }

  const ScatteringPlan& plan_;
  int64_t signals_ = 0;
  std::vector<Cf> a_, b_, x0_, u1_, u2_;
  std::vector<float> real_;
};

}  // namespace

void ScatteringForward(const ScatteringPlan& plan, const float* in, int64_t count, float* out) {
  const int64_t signals = count * plan.shape.channels;
  const int64_t in_size = plan.shape.height * plan.shape.width;
  const int64_t out_size = plan.paths * plan.out_h * plan.out_w;
  // Per signal: four complex grids, the order-1 DFTs kept for order 2, one real grid.
  const int64_t grid = plan.padded_h * plan.padded_w;
  const int64_t per_signal =
      grid * (static_cast<int64_t>(sizeof(Cf)) * (4 + plan.shape.scales * plan.shape.angles) +
              static_cast<int64_t>(sizeof(float)));
  const int64_t chunk = std::clamp<int64_t>(kScratchBytes / per_signal, 1, kChunk);
  Transformer t(plan, std::min(signals, chunk));
  for (int64_t begin = 0; begin < signals; begin += chunk) {
    t.Run(in + begin * in_size, std::min(chunk, signals - begin), out + begin * out_size);
  }
}

}  // namespace huddle::kernels::HUDDLE_CPU_ISA_VARIANT

#endif
