// The scattering transform's plan: Morlet and Gaussian filters in the Fourier domain and the DFT
// matrices (kernels/scattering.h). Built in double precision, once per shape.
#include "kernels/scattering.h"

#include <cmath>
#include <numbers>

namespace huddle::kernels {
namespace {

using Complex = std::complex<double>;
using Grid = std::vector<Complex>;  // [rows][cols] row-major

// The spatial Gabor kernel on an m x n grid, periodised over 5 x 5 copies of the grid (as
// kymatio's gabor_2d): exp(-x^T C x + i xi (x cos theta + y sin theta)) / (2 pi sigma^2 / slant)
// with C = R diag(1, slant^2) R^T / (2 sigma^2), R the rotation by theta.
Grid Gabor(int64_t m, int64_t n, double sigma, double theta, double xi, double slant) {
  const double c = std::cos(theta), s = std::sin(theta);
  // R D R^T / (2 sigma^2), D = diag(1, slant^2).
  const double k = 1.0 / (2.0 * sigma * sigma), s2 = slant * slant;
  const double c00 = (c * c + s * s * s2) * k;
  const double c01 = (c * s - s * c * s2) * k;  // = c10
  const double c11 = (s * s + c * c * s2) * k;
  Grid g(static_cast<size_t>(m * n), Complex(0, 0));
  for (int64_t ex = -2; ex <= 2; ++ex) {
    for (int64_t ey = -2; ey <= 2; ++ey) {
      for (int64_t x = 0; x < m; ++x) {
        for (int64_t y = 0; y < n; ++y) {
          const auto xx = static_cast<double>(x + ex * m), yy = static_cast<double>(y + ey * n);
          const double re = -(c00 * xx * xx + 2.0 * c01 * xx * yy + c11 * yy * yy);
          const double im = xi * (xx * c + yy * s);
          g[static_cast<size_t>(x * n + y)] += std::exp(Complex(re, im));
        }
      }
    }
  }
  const double norm = 2.0 * std::numbers::pi * sigma * sigma / slant;
  for (Complex& v : g) v /= norm;
  return g;
}

// The Morlet wavelet: the Gabor kernel minus the multiple of its envelope that makes its sum zero.
Grid Morlet(int64_t m, int64_t n, double sigma, double theta, double xi, double slant) {
  Grid wave = Gabor(m, n, sigma, theta, xi, slant);
  const Grid envelope = Gabor(m, n, sigma, theta, 0.0, slant);
  Complex wave_sum(0, 0), envelope_sum(0, 0);
  for (size_t i = 0; i < wave.size(); ++i) {
    wave_sum += wave[i];
    envelope_sum += envelope[i];
  }
  const Complex k = wave_sum / envelope_sum;
  for (size_t i = 0; i < wave.size(); ++i) wave[i] -= k * envelope[i];
  return wave;
}

// The real part of the unnormalised 2-D DFT of g (m x n), [m][n]: along the rows, then the
// columns.
std::vector<double> RealDft(const Grid& g, int64_t m, int64_t n) {
  auto twiddle = [](int64_t k, int64_t x, int64_t size) {
    return std::polar(1.0, -2.0 * std::numbers::pi * static_cast<double>((k * x) % size) /
                               static_cast<double>(size));
  };
  Grid rows(g.size(), Complex(0, 0));  // [x][k2]
  for (int64_t x = 0; x < m; ++x) {
    for (int64_t k2 = 0; k2 < n; ++k2) {
      Complex sum(0, 0);
      for (int64_t y = 0; y < n; ++y) sum += g[static_cast<size_t>(x * n + y)] * twiddle(k2, y, n);
      rows[static_cast<size_t>(x * n + k2)] = sum;
    }
  }
  std::vector<double> out(g.size());
  for (int64_t k1 = 0; k1 < m; ++k1) {
    for (int64_t k2 = 0; k2 < n; ++k2) {
      Complex sum(0, 0);
      for (int64_t x = 0; x < m; ++x)
        sum += rows[static_cast<size_t>(x * n + k2)] * twiddle(k1, x, m);
      out[static_cast<size_t>(k1 * n + k2)] = sum.real();
    }
  }
  return out;
}

// The filter at resolution r: the low-frequency (m / 2^r) x (n / 2^r) crop of its DFT (positive
// frequencies from the start of each axis, negative ones from its end), stored transposed
// [n / 2^r][m / 2^r] as the workspace's Fourier arrays are.
std::vector<float> CropTransposed(const std::vector<double>& f, int64_t m, int64_t n, int64_t r) {
  const int64_t mr = m >> r, nr = n >> r;
  auto source = [](int64_t k, int64_t full, int64_t cropped) {
    return k < cropped / 2 ? k : k + full - cropped;
  };
  std::vector<float> out(static_cast<size_t>(mr * nr));
  for (int64_t a = 0; a < mr; ++a) {
    for (int64_t b = 0; b < nr; ++b) {
      out[static_cast<size_t>(b * mr + a)] =
          static_cast<float>(f[static_cast<size_t>(source(a, m, mr) * n + source(b, n, nr))]);
    }
  }
  return out;
}

// The DFT matrix of size n (sign -1) or its inverse (sign +1, divided by n), as a real GEMM
// operand over interleaved complex values: [2n][2n], or [n][2n] for a real input.
std::vector<float> DftMatrix(int64_t n, bool inverse, bool real_input) {
  const int64_t rows = real_input ? n : 2 * n, cols = 2 * n;
  std::vector<float> f(static_cast<size_t>(rows * cols));
  auto at = [&](int64_t r, int64_t c) -> float& { return f[static_cast<size_t>(r * cols + c)]; };
  for (int64_t x = 0; x < n; ++x) {
    for (int64_t k = 0; k < n; ++k) {
      const double angle = (inverse ? 2.0 : -2.0) * std::numbers::pi *
                           static_cast<double>((k * x) % n) / static_cast<double>(n);
      const Complex v = std::polar(inverse ? 1.0 / static_cast<double>(n) : 1.0, angle);
      const auto re = static_cast<float>(v.real()), im = static_cast<float>(v.imag());
      if (real_input) {
        at(x, 2 * k) = re;
        at(x, 2 * k + 1) = im;
      } else {
        at(2 * x, 2 * k) = re;
        at(2 * x, 2 * k + 1) = im;
        at(2 * x + 1, 2 * k) = -im;
        at(2 * x + 1, 2 * k + 1) = re;
      }
    }
  }
  return f;
}

}  // namespace

int64_t ScatteringPaths(int64_t scales, int64_t angles) {
  return 1 + scales * angles + angles * angles * scales * (scales - 1) / 2;
}

ScatteringPlan MakeScatteringPlan(const ScatteringShape& shape) {
  ScatteringPlan plan;
  plan.shape = shape;
  const int64_t J = shape.scales, L = shape.angles, step = int64_t{1} << J;
  plan.paths = ScatteringPaths(J, L);
  plan.padded_h = (shape.height / step + 2) * step;
  plan.padded_w = (shape.width / step + 2) * step;
  plan.pad_top = (plan.padded_h - shape.height) / 2;
  plan.pad_left = (plan.padded_w - shape.width) / 2;
  plan.out_h = plan.padded_h / step - 2;
  plan.out_w = plan.padded_w / step - 2;
  const int64_t m = plan.padded_h, n = plan.padded_w;
  for (int64_t r = 0; r <= J; ++r) {
    plan.dft_w_real.push_back(DftMatrix(n >> r, false, true));
    plan.dft_h.push_back(DftMatrix(m >> r, false, false));
    plan.idft_h.push_back(DftMatrix(m >> r, true, false));
    plan.idft_w.push_back(DftMatrix(n >> r, true, false));
  }
  for (int64_t j = 0; j < J; ++j) {
    for (int64_t t = 0; t < L; ++t) {
      const double theta =
          static_cast<double>(
              static_cast<int64_t>(static_cast<double>(L) - static_cast<double>(L) / 2.0 - 1.0) -
              t) *
          std::numbers::pi / static_cast<double>(L);
      const double scale = std::ldexp(1.0, static_cast<int>(j));
      const std::vector<double> f =
          RealDft(Morlet(m, n, 0.8 * scale, theta, 0.75 * std::numbers::pi / scale,
                         4.0 / static_cast<double>(L)),
                  m, n);
      std::vector<std::vector<float>>& levels = plan.psi.emplace_back();
      for (int64_t r = 0; r < J; ++r) levels.push_back(CropTransposed(f, m, n, r));
    }
  }
  const std::vector<double> phi =
      RealDft(Gabor(m, n, 0.8 * std::ldexp(1.0, static_cast<int>(J - 1)), 0.0, 0.0, 1.0), m, n);
  for (int64_t r = 0; r < J; ++r) plan.phi.push_back(CropTransposed(phi, m, n, r));
  return plan;
}

}  // namespace huddle::kernels
