// A replay-buffer participant for the multi-process crash tests (crash_test.cc), run as its
// own process so that it can be killed with SIGKILL at any moment.
//
//   stress_worker writer SEGMENT WRITER_ID FIRST_SEQ LAST_SEQ LOG
//     writes groups FIRST_SEQ..LAST_SEQ-1 (content a pure function of (WRITER_ID, seq)) and
//     appends "seq" to LOG after each WriteGroup returns OK.
//   stress_worker reader SEGMENT READER_ID LOG STOP_FILE
//     takes groups, checks every byte against the regenerated content, appends
//     "writer seq" to LOG *before* acking (so a crash can only duplicate, never lose), and exits
//     once STOP_FILE exists and nothing is left to take.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "replay/replay_buffer.h"
#include "tests/replay/stress_content.h"

namespace {

void AppendLine(int fd, const std::string& line) {
  const std::string text = absl::StrCat(line, "\n");
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) std::abort();
}

int Writer(const std::string& segment, int writer, int64_t first, int64_t last,
           const std::string& log) {
  auto buffer = prl::ReplayBuffer::Open(segment);
  if (!buffer.ok()) {
    std::fprintf(stderr, "writer: %s\n", std::string(buffer.status().message()).c_str());
    return 2;
  }
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  for (int64_t seq = first; seq < last; ++seq) {
    const std::vector<prl::RolloutRecord> group = prl::testing::StressGroup(writer, seq);
    const absl::Status s = (*buffer)->WriteGroup(group, absl::Seconds(60));
    if (!s.ok()) {
      std::fprintf(stderr, "writer %d seq %lld: %s\n", writer, static_cast<long long>(seq),
                   std::string(s.message()).c_str());
      return 3;
    }
    AppendLine(fd, absl::StrCat(seq));
  }
  return 0;
}

int Reader(const std::string& segment, int reader, const std::string& log,
           const std::string& stop_file) {
  auto buffer = prl::ReplayBuffer::Open(segment);
  if (!buffer.ok()) return 2;
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  prl::TakeOptions take;
  take.max_groups = 1 + reader % 4;
  take.timeout = absl::Milliseconds(100);
  while (true) {
    auto groups = (*buffer)->Take(take);
    if (!groups.ok()) return 4;
    if (groups->empty()) {
      if (access(stop_file.c_str(), F_OK) == 0) return 0;
      continue;
    }
    for (const prl::LeasedGroup& g : *groups) {
      auto records = g.Decode();
      if (!records.ok()) {
        // Only possible when the lease was lost and the bytes reused: Ack must then fail.
        if ((*buffer)->Ack(g).ok()) {
          std::fprintf(stderr, "reader %d: undecodable group acked: %s\n", reader,
                       std::string(records.status().message()).c_str());
          return 5;
        }
        continue;
      }
      int writer = -1;
      int64_t seq = -1;
      if (!prl::testing::CheckStressGroup(*records, &writer, &seq)) {
        std::fprintf(stderr, "reader %d: a group differs from what was written\n", reader);
        return 6;
      }
      AppendLine(fd, absl::StrCat(writer, " ", seq));
      (*buffer)->Ack(g).IgnoreError();  // a lost lease is fine: the group was re-delivered
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "writer" && argc == 7) {
    return Writer(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]), argv[6]);
  }
  if (mode == "reader" && argc == 6) return Reader(argv[2], std::atoi(argv[3]), argv[4], argv[5]);
  std::fprintf(stderr, "usage: see the file comment of tests/replay/stress_worker.cc\n");
  return 1;
}
