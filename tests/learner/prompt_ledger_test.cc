// The trained-prompt ledger (learner/prompt_ledger.h) and the prompt keys of the step journal
// (learner/step_journal.h): both round-trip through their files, a damaged file is an error
// naming where, and groups without a prompt set id are never keyed.
#include "learner/prompt_ledger.h"

#include <gtest/gtest.h>

#include <fstream>

#include "learner/step_journal.h"
#include "tests/learner/learner_testing.h"

namespace prl::learner {
namespace {

using testing::ScratchDir;

TEST(PromptLedgerTest, KeysNameTheSetAndIndexAndGroupsWithoutASetHaveNone) {
  EXPECT_EQ(PromptLedger::Key("ps-1", 7), "ps-1\t7");
  EXPECT_EQ(PromptLedger::Key("", 7), "");
  EXPECT_EQ(PromptLedger::Key("bad\nid", 7), "");
  PromptLedger ledger;
  ledger.Add(1, "");
  EXPECT_EQ(ledger.size(), 0);
}

TEST(PromptLedgerTest, RoundTripsInTrainingOrderAndAMissingFileIsEmpty) {
  ScratchDir dir("prompt_ledger");
  PromptLedger ledger;
  ledger.Add(1, PromptLedger::Key("b", 2));
  ledger.Add(1, PromptLedger::Key("a", 9));
  ledger.Add(2, PromptLedger::Key("b", 0));
  ASSERT_TRUE(ledger.Write(dir.path() + "/ledger.tsv").ok());
  auto read = PromptLedger::Read(dir.path() + "/ledger.tsv");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 3);
  EXPECT_TRUE(read->Contains("a\t9"));
  EXPECT_FALSE(read->Contains("a\t2"));
  ASSERT_TRUE(read->Write(dir.path() + "/again.tsv").ok());
  std::ifstream a(dir.path() + "/ledger.tsv"), b(dir.path() + "/again.tsv");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
            std::string(std::istreambuf_iterator<char>(b), {}));
  auto missing = PromptLedger::Read(dir.path() + "/none.tsv");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->size(), 0);
}

// Issue 28: the ledger kept every trained key forever. A retired set's keys leave it, and only
// that set's ("ps-1" is not a prefix match of "ps-10").
TEST(PromptLedgerTest, ARetiredSetsKeysAreForgottenAndNoOtherSets) {
  PromptLedger ledger;
  for (uint64_t i = 0; i < 3; ++i) {
    ledger.Add(1, PromptLedger::Key("ps-1", i));
    ledger.Add(1, PromptLedger::Key("ps-10", i));
  }
  EXPECT_EQ(ledger.ForgetSet("ps-1"), 3);
  EXPECT_EQ(ledger.size(), 3);
  EXPECT_FALSE(ledger.Contains("ps-1\t0"));
  EXPECT_TRUE(ledger.Contains("ps-10\t0"));
  EXPECT_EQ(ledger.ForgetSet("ps-1"), 0) << "forgetting twice is harmless";
}

TEST(PromptLedgerTest, AMalformedLineIsDataLossNamingTheLine) {
  ScratchDir dir("prompt_ledger_bad");
  std::ofstream(dir.path() + "/ledger.tsv") << "1\tps\t0\n1\tps\n";
  auto read = PromptLedger::Read(dir.path() + "/ledger.tsv");
  ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("line 2"), std::string::npos) << read.status();
}

TEST(StepJournalTest, PromptKeysRoundTripBesideGroupKeysAndPayload) {
  ScratchDir dir("journal_prompts");
  auto journal = StepJournal::Open(dir.path());
  ASSERT_TRUE(journal.ok());
  JournaledStep step{1, 2, 8, 0.25, {11, 12}, {"ps\t3", "ps\t4"}, {1, 2, 3}};
  ASSERT_TRUE(journal->Append(step).ok());
  auto steps = journal->StepsAfter(0);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ((*steps)[0].group_keys, step.group_keys);
  EXPECT_EQ((*steps)[0].prompt_keys, step.prompt_keys);
  EXPECT_EQ((*steps)[0].payload, step.payload);
}

}  // namespace
}  // namespace prl::learner
