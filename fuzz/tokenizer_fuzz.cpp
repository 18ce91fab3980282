// Fuzz target: a BPE tokenizer file (JSON: merges, special tokens, vocabulary size). A file that
// loads must encode and decode losslessly and save to a file that loads as the same tokenizer.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "mantissa/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string& path = fuzz::input_file(data, size);
  fuzz::expect_only_mantissa_errors([&] {
    const data::BpeTokenizer tok = data::BpeTokenizer::load(path);
    // Text that reaches merges of common pairs, a special token's text and bytes that are not
    // UTF-8.
    const std::string text =
        std::string("the theme of these: <|endoftext|> 12 345\n\xff\xfe  ") +
        std::string(reinterpret_cast<const char*>(data), std::min<size_t>(size, 64));
    const std::vector<uint32_t> ids = tok.encode(text);
    FUZZ_REQUIRE(tok.decode(ids) == text, "decode(encode(text)) != text");
    const std::string copy = path + ".saved";
    tok.save(copy);
    const data::BpeTokenizer again = data::BpeTokenizer::load(copy);
    std::remove(copy.c_str());
    FUZZ_REQUIRE(again.fingerprint() == tok.fingerprint() && again.vocab_size() == tok.vocab_size(),
                 "a saved tokenizer loads differently");
  });
  return 0;
}
