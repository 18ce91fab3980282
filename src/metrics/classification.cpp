#include "mantissa/metrics/classification.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "mantissa/core/error.h"

namespace mantissa::metrics {

double roc_auc(std::span<const float> score, std::span<const float> label) {
  MT_CHECK(score.size() == label.size(), "roc_auc: ", score.size(), " scores but ", label.size(),
           " labels");
  const size_t n = score.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  double positives = 0, rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && score[order[j]] == score[order[i]])
      ++j;
    const double rank = 0.5 * double(i + 1 + j);  // the average of ranks i+1 .. j
    for (size_t k = i; k < j; ++k) {
      if (label[order[k]] > 0.5f) {
        positives += 1;
        rank_sum += rank;
      }
    }
    i = j;
  }
  const double negatives = double(n) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

double binary_log_loss(std::span<const float> logits, std::span<const float> label) {
  MT_CHECK(logits.size() == label.size(), "binary_log_loss: ", logits.size(), " logits but ",
           label.size(), " labels");
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i];
    sum += std::max(z, 0.0) - z * double(label[i]) + std::log1p(std::exp(-std::fabs(z)));
  }
  return logits.empty() ? 0.0 : sum / double(logits.size());
}

}  // namespace mantissa::metrics
