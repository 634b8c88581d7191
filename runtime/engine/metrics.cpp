#include "runtime/engine/metrics.h"

#include <algorithm>
#include <cmath>

namespace genbridge::engine {

double percentile(const std::vector<double>& samples, double p) {
  if (samples.empty()) return 0.0;
  std::vector<double> s = samples;
  std::sort(s.begin(), s.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(s.size()));
  const size_t idx = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(s.size()))) - 1;
  return s[idx];
}

double mean(const std::vector<double>& samples) {
  if (samples.empty()) return 0.0;
  double t = 0;
  for (double v : samples) t += v;
  return t / static_cast<double>(samples.size());
}

}  // namespace genbridge::engine
