// Metrics of binary classifiers' scores against 0/1 labels (the recommender's held-out
// evaluation), in float64 on the host.
#pragma once

#include <span>

namespace mantissa::metrics {

// ROC AUC of scores against 0/1 labels: the Mann-Whitney statistic with tied scores given their
// average rank. NaN without both classes.
double roc_auc(std::span<const float> score, std::span<const float> label);

// The mean binary cross-entropy (nats) of logits z against 0/1 labels y, in float64:
// max(z, 0) - z y + log(1 + exp(-|z|)) per example; 0 for no examples.
double binary_log_loss(std::span<const float> logits, std::span<const float> label);

}  // namespace mantissa::metrics
