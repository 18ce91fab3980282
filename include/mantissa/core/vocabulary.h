// Closed vocabularies: an enum whose every value has a name a user types (a flag's value, a
// config file's string, a checkpoint's JSON) and a line of help. The enum and its table of words
// come from one list, so neither can miss a value (docs/design.md §7: one table per concept);
// parsing, listing, "did you mean" and the error a wrong word gets are written once, here.
//
//   #define MT_FORALL_SCHEDULES(_)  (each row ends in a backslash)
//     _(Constant, "constant", "the learning rate as given")
//     _(Step, "step", "times --gamma every --step-size steps")
//     _(Cosine, "cosine", "linear warmup, then a cosine to 0")
//   MT_VOCABULARY(ScheduleKind, MT_FORALL_SCHEDULES)
//
//   name_of(ScheduleKind::Cosine)                   "cosine"
//   find_word<ScheduleKind>("step")                 ScheduleKind::Step (an std::optional)
//   parse_word<ScheduleKind>("cosin", "--schedule")  mantissa::Error: "unknown --schedule
//       'cosin'; did you mean 'cosine'? use constant: the learning rate as given; step: ...; or
//       cosine: ..."
//
// A row may carry more columns after its help (a precision's dtype, say): the list macro is then
// expanded again into a table of those, indexed by the same enum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace mantissa {

struct Word {
  std::string_view name;  // what a user types; unique in its vocabulary
  std::string_view help;  // a few words on what it means
};

// An enum E with a vocabulary: `words(E)`, found by argument-dependent lookup, returns its table,
// one Word per enumerator in declaration order (MT_VOCABULARY writes both).
template <typename E>
concept Vocabulary = std::is_enum_v<E> && requires(E e) {
  { words(e) } -> std::convertible_to<std::span<const Word>>;
};

template <Vocabulary E>
constexpr std::span<const Word> words_of() {
  return words(E{});
}

template <Vocabulary E>
constexpr std::string_view name_of(E e) {
  return words(e)[static_cast<size_t>(e)].name;
}

template <Vocabulary E>
constexpr std::string_view help_of(E e) {
  return words(e)[static_cast<size_t>(e)].help;
}

// Every value of E, in its table's order.
template <Vocabulary E>
std::vector<E> all_words() {
  std::vector<E> out;
  for (size_t i = 0; i < words_of<E>().size(); ++i)
    out.push_back(static_cast<E>(i));
  return out;
}

template <Vocabulary E>
constexpr std::optional<E> find_word(std::string_view name) {
  const std::span<const Word> w = words_of<E>();
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i].name == name) return static_cast<E>(i);
  return std::nullopt;
}

// "a, b or c" (with_help: "a: help; b: help; or c: help").
std::string word_list(std::span<const Word> words, bool with_help = false);

// The candidate nearest to `given` when it is close enough to be a typo or a prefix ("batch" for
// "batch-size", "cosin" for "cosine"), else "". For any list of names: words, option names, keys.
std::string nearest_name(std::string_view given, std::span<const std::string_view> candidates);

// The Levenshtein distance between a and b.
size_t edit_distance(std::string_view a, std::string_view b);

namespace detail {
[[noreturn]] void unknown_word(std::string_view what, std::string_view given,
                               std::span<const Word> words);
}  // namespace detail

// The value named `name`, or a mantissa::Error that names `what` (e.g. "--precision"), the word
// given, the nearest word when it is close, and every word with its help.
template <Vocabulary E>
E parse_word(std::string_view name, std::string_view what) {
  if (const std::optional<E> e = find_word<E>(name)) return *e;
  detail::unknown_word(what, name, words_of<E>());
}

}  // namespace mantissa

// The rows of a vocabulary list: _(Enumerator, "name", "help", extra columns...).
#define MT_VOCAB_ENUMERATOR(e, name, help, ...) e,
#define MT_VOCAB_WORD(e, name, help, ...) ::mantissa::Word{name, help},

// Declares `enum class Enum : uint8_t` with the list's enumerators, its words and `words(Enum)`,
// in the current namespace.
#define MT_VOCABULARY(Enum, LIST)                                             \
  enum class Enum : uint8_t { LIST(MT_VOCAB_ENUMERATOR) };                    \
  inline constexpr ::mantissa::Word k##Enum##Words[] = {LIST(MT_VOCAB_WORD)}; \
  constexpr std::span<const ::mantissa::Word> words(Enum) {                   \
    return k##Enum##Words;                                                    \
  }
