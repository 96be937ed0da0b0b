// Order statistics of a benchmark's repeated measurements (every `prl bench` uses these).
#pragma once

#include <vector>

namespace prl::bench {

// The median: the middle value, or the mean of the middle two for an even count; 0 if empty.
double Median(std::vector<double> values);
// The value at quantile q in [0, 1] by nearest rank (q = 0.99: the 99th percentile); 0 if empty.
double Percentile(std::vector<double> values, double q);

}  // namespace prl::bench
