// Closed vocabularies (core/vocabulary.h): names, lookups, the message a wrong word gets, and the
// nearest-name rule the option and key errors share.
#include "mantissa/core/vocabulary.h"

#include <gtest/gtest.h>

#include <string>

#include "harness/errors.h"

namespace mantissa {
namespace {

#define MT_FORALL_TEST_COLORS(_)  \
  _(Red, "red", "the first")      \
  _(Green, "green", "the second") \
  _(DarkBlue, "dark-blue", "the third")
MT_VOCABULARY(TestColor, MT_FORALL_TEST_COLORS)

TEST(Vocabulary, EveryEnumeratorHasItsWordInOrder) {
  static_assert(Vocabulary<TestColor>);
  EXPECT_EQ(words_of<TestColor>().size(), 3u);
  EXPECT_EQ(name_of(TestColor::DarkBlue), "dark-blue");
  EXPECT_EQ(help_of(TestColor::Green), "the second");
  EXPECT_EQ(all_words<TestColor>().back(), TestColor::DarkBlue);
  for (TestColor c : all_words<TestColor>())
    EXPECT_EQ(find_word<TestColor>(name_of(c)), c);
  EXPECT_FALSE(find_word<TestColor>("Red").has_value()) << "words are exact";
  EXPECT_FALSE(find_word<TestColor>("").has_value());
}

TEST(Vocabulary, AWrongWordNamesTheOptionTheNearestWordAndEveryWord) {
  const std::string typo = testing::error_of([] { parse_word<TestColor>("dark-blu", "--color"); });
  EXPECT_NE(typo.find("unknown --color 'dark-blu'; did you mean 'dark-blue'?"), std::string::npos)
      << typo;
  EXPECT_NE(typo.find("Use red: the first; green: the second; or dark-blue: the third"),
            std::string::npos)
      << typo;
  const std::string far = testing::error_of([] { parse_word<TestColor>("purple", "--color"); });
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  EXPECT_EQ(parse_word<TestColor>("green", "--color"), TestColor::Green);
}

TEST(Vocabulary, NearestNameIsATypoOrAPieceOfTheName) {
  const std::string_view keys[] = {"batch-size", "eval-batch-size", "lr", "optimizer"};
  EXPECT_EQ(nearest_name("bach-size", keys), "batch-size");
  EXPECT_EQ(nearest_name("optimiser", keys), "optimizer");
  EXPECT_EQ(nearest_name("batch", keys), "batch-size");
  EXPECT_EQ(nearest_name("zzzzzzzzzz", keys), "");
  EXPECT_EQ(nearest_name("", keys), "");
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(word_list(words_of<TestColor>()), "red, green or dark-blue");
}

}  // namespace
}  // namespace mantissa
