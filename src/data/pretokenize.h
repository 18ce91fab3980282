// Internal: GPT-2's pre-split by hand (tokenizer.h states the regular expression and the character
// classes). Inline: the encoder calls it once per pre-token.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mantissa::data::detail {

enum class CharClass : uint8_t { Letter, Number, Space, Other };

struct Char {
  CharClass cls;
  uint32_t len;  // bytes
};

// The class of a code point >= 0x80 (tokenizer.h: by block).
constexpr CharClass non_ascii_class(uint32_t cp) {
  using enum CharClass;
  if (cp < 0x100) {
    if (cp == 0x85 || cp == 0xA0) return Space;
    if (cp < 0xA0) return Other;                                // C1 controls
    if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return Letter;  // ª µ º
    if (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE)) return Number;
    if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return Other;  // Latin-1 symbols, × ÷
    return Letter;
  }
  if (cp == 0x1680 || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
      cp == 0x3000 || (cp >= 0x2000 && cp <= 0x200A))
    return Space;
  if ((cp >= 0x2000 && cp <= 0x206F) ||  // general punctuation, zero-width and format marks
      (cp >= 0x20A0 && cp <= 0x20CF) ||  // currency
      (cp >= 0x2190 && cp <= 0x2BFF) ||  // arrows, math, technical, box drawing, dingbats...
      (cp >= 0x3001 && cp <= 0x303F) ||  // CJK punctuation
      (cp >= 0xFE30 && cp <= 0xFE4F) ||  // CJK compatibility forms
      (cp >= 0xFF01 && cp <= 0xFF0F) || (cp >= 0xFF1A && cp <= 0xFF20) ||
      (cp >= 0xFF3B && cp <= 0xFF40) || (cp >= 0xFF5B && cp <= 0xFF65) ||  // fullwidth punct.
      (cp >= 0x1F000 && cp <= 0x1FAFF))  // emoji, symbols and pictographs
    return Other;
  return Letter;
}

struct AsciiTable {
  CharClass cls[128];
  constexpr AsciiTable() : cls() {
    for (int c = 0; c < 128; ++c) {
      const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      const bool digit = c >= '0' && c <= '9';
      const bool space = c == ' ' || (c >= '\t' && c <= '\r');
      cls[c] = letter  ? CharClass::Letter
               : digit ? CharClass::Number
               : space ? CharClass::Space
                       : CharClass::Other;
    }
  }
};
inline constexpr AsciiTable kAscii;

// The character at s[i] (i < n): a valid UTF-8 sequence, or one byte of class Other.
inline Char char_at(const unsigned char* s, size_t n, size_t i) {
  const unsigned c = s[i];
  if (c < 0x80) return {kAscii.cls[c], 1};
  uint32_t len = 0, cp = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the second byte's range (excludes overlongs and surrogates)
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {CharClass::Other, 1};
  }
  if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return {CharClass::Other, 1};
  cp = cp << 6 | (s[i + 1] & 0x3F);
  for (uint32_t k = 2; k < len; ++k) {
    if ((s[i + k] & 0xC0) != 0x80) return {CharClass::Other, 1};
    cp = cp << 6 | (s[i + k] & 0x3F);
  }
  return {non_ascii_class(cp), len};
}

// The end of the pre-token that starts at s[i] (i < n): the first alternative of the regular
// expression that matches at i, as a backtracking regex engine picks it.
inline size_t pretoken_end(const unsigned char* s, size_t n, size_t i) {
  const unsigned c = s[i];
  // 's 't 're 've 'm 'll 'd (case-sensitive, as GPT-2's pattern).
  if (c == '\'' && i + 1 < n) {
    const unsigned d = s[i + 1];
    if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
    if (i + 2 < n) {
      const unsigned e = s[i + 2];
      if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return i + 3;
    }
  }
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space, then a run of one class.
  const size_t j = c == ' ' && i + 1 < n ? i + 1 : i;
  const Char first = char_at(s, n, j);
  if (first.cls != CharClass::Space) {
    size_t k = j + first.len;
    while (k < n) {
      const Char next = char_at(s, n, k);
      if (next.cls != first.cls) break;
      k += next.len;
    }
    return k;
  }
  // "\s+(?!\S)|\s+": a whitespace run; when something follows it, its last character is left to
  // start the next pre-token (so " word" keeps its space), unless the run is that one character.
  size_t k = i, last = i;
  while (k < n) {
    const Char next = char_at(s, n, k);
    if (next.cls != CharClass::Space) break;
    last = k;
    k += next.len;
  }
  if (k == n || last == i) return k;
  return last;
}

// Calls f(begin, end) for each pre-token of s[0, n), in order.
template <typename F>
inline void for_each_pretoken(const unsigned char* s, size_t n, F&& f) {
  for (size_t i = 0; i < n;) {
    const size_t end = pretoken_end(s, n, i);
    f(i, end);
    i = end;
  }
}

}  // namespace mantissa::data::detail
