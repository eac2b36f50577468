#!/usr/bin/env python3
"""Writes tests/data/privacy_reference.json: reference values for the privacy accountant tests.

Run it through scripts/make_privacy_reference.sh, which sets up the pinned virtualenv. Sources:
  - dp_accounting (Google): RDP of the Poisson-subsampled Gaussian, RdpAccountant, PLDAccountant
    (pessimistic connect-the-dots, value_discretization_interval 1e-4), calibrate_dp_mechanism.
  - opacus: opacus/accountants/analysis/rdp.py only, loaded by file path (no torch).
  - mpmath: ground truth. RDP at integer orders from the finite binomial sum, at fractional orders
    from mpmath.quad of the defining integral
      A_alpha = E_{x~N(0,s^2)}[((1-q) + q e^{(2x-1)/(2s^2)})^alpha]
    at 50 digits (checked against a 40-digit run); the analytic Gaussian epsilon by bisection on
    Balle and Wang's delta(eps) at 40 digits.
Every float is written with repr(), which round-trips.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import math
import multiprocessing
import os
import time

import mpmath as mp
from dp_accounting import dp_event
from dp_accounting import mechanism_calibration
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp


def load_opacus_rdp():
  spec = importlib.util.find_spec('opacus')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('opacus is not installed (pip install --no-deps opacus)')
  path = os.path.join(list(spec.submodule_search_locations)[0], 'accountants', 'analysis',
                      'rdp.py')
  module_spec = importlib.util.spec_from_file_location('opacus_rdp_analysis', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


OPACUS_RDP = load_opacus_rdp()

# Huddle's DefaultRdpOrders(): k / 10 for k = 11..109, then 11..63, 128, 256, 512, 1024.
ORDERS = [k / 10 for k in range(11, 110)] + [float(a) for a in range(11, 64)] + [
    128.0, 256.0, 512.0, 1024.0]
INTEGER_ORDERS = [a for a in ORDERS if a == int(a)]
FRACTIONAL_ORDERS = [a for a in ORDERS if a != int(a)]
# Fractional orders (members of ORDERS) at which the per-order comparison is stored.
FRACTIONAL_SAMPLE = [11 / 10, 15 / 10, 25 / 10, 37 / 10, 55 / 10, 73 / 10, 99 / 10, 109 / 10]

Q_GRID = [1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0]
Z_GRID = [0.5, 0.8, 1.0, 2.0, 5.0]
# Harder settings for the RDP tables: tiny q (A_alpha - 1 ~ 1e-12), small and huge noise.
EXTRA_QZ = [(1e-6, 0.5), (1e-6, 1.0), (0.01, 0.3), (0.9, 0.3), (1e-3, 50.0)]

# (q, z, steps, delta) for the RDP accountant's epsilon.
RDP_EPSILON_CASES = [
    (0.01, 1.1, 10000, 1e-5),
    (0.1, 1.0, 100, 1e-5),
    (0.01, 2.0, 1000, 1e-5),
    (0.001, 0.8, 1000, 1e-6),
    (0.001, 5.0, 1000, 1e-8),
    (0.5, 0.8, 10, 1e-6),
    (1e-4, 1.0, 100000, 1e-7),
    (1.0, 5.0, 10, 1e-5),
    (0.05, 3.0, 50, 1e-5),
    (0.02, 10.0, 10, 1e-5),
    (0.01, 5.0, 100, 1e-5),
]

# ([(q, z, steps), ...], delta) for the PLD accountant.
PLD_CASES = [
    ([(0.01, 1.1, 10000)], 1e-5),
    ([(0.1, 1.0, 100)], 1e-5),
    ([(0.001, 0.8, 1000)], 1e-6),
    ([(0.01, 2.0, 1000)], 1e-5),
    ([(0.5, 1.0, 10)], 1e-6),
    ([(1.0, 2.0, 10)], 1e-5),
    ([(0.05, 0.7, 200)], 1e-7),
    ([(0.001, 5.0, 1000)], 1e-8),
    ([(0.02, 1.5, 500)], 1e-6),
    ([(0.01, 1.0, 100), (1.0, 5.0, 3)], 1e-5),
]

ANALYTIC_Z = [0.5, 1.0, 2.0, 5.0, 20.0]
ANALYTIC_STEPS = [1, 10, 100]
ANALYTIC_DELTAS = [1e-5, 1e-8]

# (target_epsilon, delta, q, steps, accountant)
CALIBRATION_CASES = [
    (1.0, 1e-5, 0.01, 1000, 'rdp'),
    (8.0, 1e-5, 0.004, 10000, 'rdp'),
    (0.5, 1e-6, 0.1, 20, 'rdp'),
    (3.0, 1e-6, 0.1, 100, 'pld'),
    (1.0, 1e-5, 0.01, 1000, 'pld'),
    (0.5, 1e-5, 1.0, 10, 'analytic'),
    (2.0, 1e-6, 1.0, 1, 'analytic'),
]


def exact_rdp_integer(q, z, alpha, dps=40):
  """log(A_alpha)/(alpha-1) from the finite binomial sum, exact at `dps` digits."""
  with mp.workdps(dps):
    q, s = mp.mpf(q), mp.mpf(z)
    n = int(alpha)
    total = mp.mpf(0)
    for i in range(n + 1):
      total += mp.binomial(n, i) * (1 - q)**(n - i) * q**i * mp.exp(mp.mpf(i * i - i) / (2 * s * s))
    return mp.log(total) / (n - 1)


def exact_rdp_quad(q, z, alpha, dps=50):
  """log(A_alpha)/(alpha-1) by mpmath.quad of the defining integral at `dps` digits."""
  with mp.workdps(dps):
    q, s, a = mp.mpf(q), mp.mpf(z), mp.mpf(alpha)

    def integrand(x):
      return mp.npdf(x, 0, s) * ((1 - q) + q * mp.exp((2 * x - 1) / (2 * s * s)))**a

    # The integrand is a mixture of N(i, s^2)-shaped bumps for i in [0, alpha]: break there.
    points = {-mp.inf, -12 * s, mp.mpf(0), mp.mpf(1) / 2, a + 12 * s, mp.inf}
    points.update(mp.mpf(k) for k in range(1, int(math.ceil(alpha)) + 1))
    area = mp.quad(integrand, sorted(points))
    return mp.log(area) / (a - 1)


def opacus_rdp(q, z, alpha):
  try:
    return float(OPACUS_RDP._compute_rdp(q, z, alpha))  # pylint: disable=protected-access
  except ValueError:  # its signed series can fail ("result of subtraction must be >= 0")
    return None


def dpa_rdp_one(q, z, alpha):
  rdp = dpa_rdp._compute_rdp_poisson_subsampled_gaussian  # pylint: disable=protected-access
  return float(rdp(q, z, [alpha])[0])


def integer_table(qz):
  q, z = qz
  return {
      'q': q, 'z': z, 'orders': INTEGER_ORDERS,
      'mpmath': [float(exact_rdp_integer(q, z, a)) if q < 1 else a / (2 * z * z)
                 for a in INTEGER_ORDERS],
      'dp_accounting': [dpa_rdp_one(q, z, a) for a in INTEGER_ORDERS],
      'opacus': [opacus_rdp(q, z, a) for a in INTEGER_ORDERS],
  }


def fractional_table(qz):
  q, z = qz
  exact50, exact40 = [], []
  for a in FRACTIONAL_SAMPLE:
    if q == 1:
      exact50.append(a / (2 * z * z))
      exact40.append(a / (2 * z * z))
      continue
    v50 = exact_rdp_quad(q, z, a, 50)
    v40 = exact_rdp_quad(q, z, a, 40)
    exact50.append(float(v50))
    exact40.append(float(abs((v50 - v40) / v50)))
  return {
      'q': q, 'z': z, 'orders': FRACTIONAL_SAMPLE, 'mpmath': exact50,
      'mpmath_50_vs_40_digits_rel_diff': max(exact40) if q < 1 else 0.0,
      'dp_accounting': [dpa_rdp_one(q, z, a) for a in FRACTIONAL_SAMPLE],
      'opacus': [opacus_rdp(q, z, a) for a in FRACTIONAL_SAMPLE],
  }


def exact_curve(qz):
  """One-step exact RDP at every order in ORDERS (fractional ones by quad at 30 digits)."""
  q, z = qz
  if q == 1:
    return [a / (2 * z * z) for a in ORDERS]
  return [float(exact_rdp_integer(q, z, a)) if a == int(a) else float(exact_rdp_quad(q, z, a, 30))
          for a in ORDERS]


def rdp_epsilon_case(case, curve):
  q, z, steps, delta = case
  accountant = dpa_rdp.RdpAccountant()
  accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
  eps, order = accountant.get_epsilon_and_optimal_order(delta)
  exact_eps, exact_order = dpa_rdp.compute_epsilon(ORDERS, [steps * r for r in curve], delta)
  return {'q': q, 'z': z, 'steps': steps, 'delta': delta,
          'dp_accounting_epsilon': float(eps), 'dp_accounting_order': float(order),
          'exact_epsilon': float(exact_eps), 'exact_order': float(exact_order)}


def pld_case(case):
  events, delta = case
  accountant = pld_privacy_accountant.PLDAccountant()
  start = time.time()
  for q, z, steps in events:
    accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
  eps = accountant.get_epsilon(delta)
  return {'events': [list(e) for e in events], 'delta': delta, 'epsilon': float(eps),
          'dp_accounting_seconds': round(time.time() - start, 3)}


def analytic_delta(z, eps):
  a, b = 1 / (2 * z), eps * z
  return mp.ncdf(a - b) - mp.exp(eps) * mp.ncdf(-a - b)


def analytic_epsilon(z, delta, dps=40):
  """Smallest eps >= 0 with delta(eps) <= delta (Balle and Wang 2018), by bisection."""
  with mp.workdps(dps):
    z, delta = mp.mpf(z), mp.mpf(delta)
    if analytic_delta(z, 0) <= delta:
      return mp.mpf(0)
    lo, hi = mp.mpf(0), mp.mpf(1)
    while analytic_delta(z, hi) > delta:
      lo, hi = hi, 2 * hi
    for _ in range(150):
      mid = (lo + hi) / 2
      if analytic_delta(z, mid) > delta:
        lo = mid
      else:
        hi = mid
    return hi


def analytic_case(case):
  z, steps, delta = case
  return {'z': z, 'steps': steps, 'delta': delta,
          'epsilon': float(analytic_epsilon(mp.mpf(z) / mp.sqrt(steps), delta))}


def calibration_case(case):
  target, delta, q, steps, kind = case
  if kind == 'analytic':
    # z with eps(z / sqrt(steps)) = target, to 30 digits (eps decreases in z).
    with mp.workdps(40):
      lo, hi = mp.mpf('1e-3'), mp.mpf(1)
      while analytic_epsilon(hi / mp.sqrt(steps), delta) > target:
        lo, hi = hi, 2 * hi
      for _ in range(110):
        mid = (lo + hi) / 2
        if analytic_epsilon(mid / mp.sqrt(steps), delta) > target:
          lo = mid
        else:
          hi = mid
      z = float(hi)
  else:
    make = (dpa_rdp.RdpAccountant if kind == 'rdp' else pld_privacy_accountant.PLDAccountant)
    z = mechanism_calibration.calibrate_dp_mechanism(
        make, lambda s: dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), steps),
        target, delta, mechanism_calibration.LowerEndpointAndGuess(0, 1), tol=1e-7)
  return {'target_epsilon': target, 'delta': delta, 'q': q, 'steps': steps, 'accountant': kind,
          'noise_multiplier': float(z)}


def finite_or_none(value):
  """JSON has no infinity or NaN: such values (a library that gave up) are written as null."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, list):
    return [finite_or_none(v) for v in value]
  if isinstance(value, dict):
    return {k: finite_or_none(v) for k, v in value.items()}
  return value


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--jobs', type=int, default=2)
  args = parser.parse_args()
  start = time.time()
  grid = [(q, z) for q in Q_GRID for z in Z_GRID] + EXTRA_QZ
  epsilon_qz = sorted({(c[0], c[1]) for c in RDP_EPSILON_CASES})
  with multiprocessing.Pool(args.jobs) as pool:
    integer = pool.map(integer_table, grid)
    print(f'integer orders done ({time.time() - start:.0f} s)', flush=True)
    fractional = pool.map(fractional_table, grid)
    print(f'fractional orders done ({time.time() - start:.0f} s)', flush=True)
    curves = dict(zip(epsilon_qz, pool.map(exact_curve, epsilon_qz)))
    print(f'exact curves done ({time.time() - start:.0f} s)', flush=True)
    analytic = pool.map(analytic_case, [(z, t, d) for z in ANALYTIC_Z for t in ANALYTIC_STEPS
                                        for d in ANALYTIC_DELTAS])
    calibration = pool.map(calibration_case, CALIBRATION_CASES)
    print(f'analytic and calibration done ({time.time() - start:.0f} s)', flush=True)
  rdp_epsilon = [rdp_epsilon_case(c, curves[(c[0], c[1])]) for c in RDP_EPSILON_CASES]
  pld = [pld_case(c) for c in PLD_CASES]  # serially, so that the timings mean something
  print(f'pld done ({time.time() - start:.0f} s)', flush=True)

  versions = {name: importlib.metadata.version(name)
              for name in ('dp-accounting', 'opacus', 'mpmath', 'numpy', 'scipy')}
  out = {
      'generator': 'scripts/make_privacy_reference.sh (scripts/privacy_reference.py)',
      'versions': versions,
      'notes': [
          'rdp values are one-step RDP of the Poisson-subsampled Gaussian at order alpha: '
          'log(A_alpha) / (alpha - 1).',
          'mpmath: integer orders from the exact binomial sum (40 digits); fractional orders '
          'from mpmath.quad of the defining integral (50 digits).',
          'dp_accounting\'s _compute_log_a_frac adds every series term in absolute value; '
          'opacus subtracts the negative ones (and can fail, stored as null); null also marks a '
          'dp_accounting value that is +inf because its series did not converge in 1000 terms.',
          'rdp_epsilon.exact_*: dp_accounting.rdp.compute_epsilon on the mpmath RDP curve over '
          'Huddle\'s orders (fractional orders by quad at 30 digits).',
          'pld: dp_accounting PLDAccountant(), add/remove, value_discretization_interval 1e-4.',
      ],
      'rdp_integer': integer,
      'rdp_fractional': fractional,
      'rdp_epsilon': rdp_epsilon,
      'pld_epsilon': pld,
      'analytic_gaussian': analytic,
      'calibration': calibration,
  }
  with open(args.out, 'w') as f:
    json.dump(finite_or_none(out), f, separators=(',', ':'), allow_nan=False)
    f.write('\n')
  print(f'wrote {args.out} ({os.path.getsize(args.out)} bytes, {time.time() - start:.0f} s)')


if __name__ == '__main__':
  main()
