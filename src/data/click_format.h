// Internal: what the click-log reader (click_log.cpp) and the synthetic log (clicks.cpp) share.
#pragma once

#include <string>

namespace mantissa::data {

// The column delimiter of a click log: `given`, or by the file name (".csv" -> ',', else tab).
char click_delimiter(const std::string& path, char given);
// The log loss of predicting p for label y (0 or 1), p clamped to [1e-15, 1 - 1e-15].
double binary_log_loss(double p, float y);

}  // namespace mantissa::data
