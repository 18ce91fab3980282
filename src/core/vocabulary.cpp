#include "mantissa/core/vocabulary.h"

#include <algorithm>
#include <limits>

#include "mantissa/core/error.h"

namespace mantissa {

std::string word_list(std::span<const Word> words, bool with_help) {
  // With help, the words are set apart by semicolons (a help may hold commas and parentheses).
  const std::string_view sep = with_help ? "; " : ", ";
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0)
      out += i + 1 == words.size() ? std::string(with_help ? "; or " : " or ") : std::string(sep);
    out += words[i].name;
    if (with_help && !words[i].help.empty()) {
      out += ": ";
      out += words[i].help;
    }
  }
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest_name(std::string_view given, std::span<const std::string_view> candidates) {
  if (given.empty()) return "";
  std::string_view best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string_view c : candidates) {
    const size_t d = edit_distance(given, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Close: a typo or two (a third of a long name), or a piece of the name ("batch" for
  // "batch-size").
  const bool close = best_d <= std::max<size_t>(2, given.size() / 3) ||
                     (given.size() >= 3 && best.find(given) != std::string_view::npos);
  return close && best_d < std::max(given.size(), best.size()) ? std::string(best) : "";
}

namespace detail {

void unknown_word(std::string_view what, std::string_view given, std::span<const Word> words) {
  std::vector<std::string_view> names;
  for (const Word& w : words)
    names.push_back(w.name);
  const std::string near = nearest_name(given, names);
  MT_CHECK(false, "unknown ", what, " '", given, "'",
           near.empty() ? "; use " : "; did you mean '" + near + "'? Use ",
           word_list(words, /*with_help=*/true));
}

}  // namespace detail
}  // namespace mantissa
