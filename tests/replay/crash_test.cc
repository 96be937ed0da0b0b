// Multi-process tests of the replay buffer with real processes (stress_worker) that are killed
// with SIGKILL at random moments — also inside the buffer's critical sections, through the
// PRL_REPLAY_KILL_AFTER_SETS fault injection. After every run: every group a writer saw
// committed was delivered at least once, every delivered byte was exactly what was written
// (readers regenerate and compare), nothing is left leased, half-written or unreclaimed.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "replay/replay_buffer.h"

extern char** environ;

namespace prl::testing {
namespace {

struct Worker {
  bool writer;
  int id;
  pid_t pid = 0;
  int64_t last_seq = 0;  // writers: write [next, last_seq)
  bool done = false;
};

class CrashRun {
 public:
  CrashRun(int writers, int readers, int64_t groups_per_writer, uint64_t seed)
      : rng_(seed), groups_(groups_per_writer) {
    dir_ = ::testing::TempDir() + "/prl_replay_crash_" + std::to_string(getpid()) + "_" +
           std::to_string(seed);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    segment_ = "prl-test-crash-" + std::to_string(getpid()) + "-" + std::to_string(seed);
    ReplayBuffer::Remove(segment_, true).IgnoreError();
    ReplayConfig config;
    config.capacity_bytes = 8 << 20;  // small: frames wrap and writers block often
    config.lease_ms = 5000;
    buffer_ = *ReplayBuffer::Create(segment_, config);
    for (int w = 0; w < writers; ++w) workers_.push_back({true, w, 0, groups_per_writer});
    for (int r = 0; r < readers; ++r) workers_.push_back({false, r});
  }
  ~CrashRun() {
    for (Worker& w : workers_) {
      if (w.pid > 0) {
        kill(w.pid, SIGKILL);
        waitpid(w.pid, nullptr, 0);
      }
    }
    buffer_.reset();
    ReplayBuffer::Remove(segment_, true).IgnoreError();
    std::filesystem::remove_all(dir_);
  }

  std::string Log(const Worker& w) const {
    return dir_ + (w.writer ? "/writer" : "/reader") + std::to_string(w.id) + ".log";
  }

  // Writers resume after the last group their log says was written.
  int64_t NextSeq(const Worker& w) const {
    std::ifstream in(Log(w));
    int64_t seq, next = 0;
    while (in >> seq) next = std::max(next, seq + 1);
    return next;
  }

  void Start(Worker& w, int64_t kill_after_sets) {
    std::vector<std::string> args = {PRL_STRESS_WORKER};
    if (w.writer) {
      args.insert(args.end(), {"writer", segment_, std::to_string(w.id),
                               std::to_string(NextSeq(w)), std::to_string(w.last_seq), Log(w)});
    } else {
      args.insert(args.end(), {"reader", segment_, std::to_string(w.id), Log(w), dir_ + "/stop"});
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
    if (kill_after_sets >= 0) {
      env_strings.push_back("PRL_REPLAY_KILL_AFTER_SETS=" + std::to_string(kill_after_sets));
    }
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&w.pid, argv[0], nullptr, nullptr, argv.data(), envp.data()), 0);
  }

  // Reaps exited workers; returns false if one failed its own checks.
  bool Reap() {
    for (Worker& w : workers_) {
      if (w.pid <= 0) continue;
      int status = 0;
      if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.pid = 0;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        w.done = true;
      } else if (WIFEXITED(status)) {
        ADD_FAILURE() << (w.writer ? "writer " : "reader ") << w.id << " exited with "
                      << WEXITSTATUS(status);
        return false;
      }  // killed (by us or by its fault injection): restarted by the loop
    }
    return true;
  }

  void Run(bool kills) {
    for (Worker& w : workers_) Start(w, -1);
    std::uniform_int_distribution<int> pause_ms(2, 30);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(4);
    bool stopping = false;
    while (std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kills ? pause_ms(rng_) : 20));
      if (!Reap()) return;
      if (kills && !stopping) {
        // Kill a random live worker, sometimes by SIGKILL from here (any instruction), sometimes
        // by restarting it with a fault that fires inside a critical section.
        std::vector<Worker*> live;
        for (Worker& w : workers_) {
          if (w.pid > 0) live.push_back(&w);
        }
        if (!live.empty()) {
          Worker* victim = live[rng_() % live.size()];
          kill(victim->pid, SIGKILL);
          waitpid(victim->pid, nullptr, 0);
          victim->pid = 0;
          ++kills_;
          Start(*victim, rng_() % 3 == 0 ? static_cast<int64_t>(rng_() % 60) : -1);
        }
      }
      bool writers_done = true;
      for (Worker& w : workers_) {
        if (!w.writer) continue;
        if (!w.done && w.pid == 0) Start(w, -1);  // killed: resume from its log
        writers_done &= w.done;
      }
      if (writers_done && !stopping) {
        std::ofstream(dir_ + "/stop") << "stop\n";
        stopping = true;
      }
      const ReplayStats st = buffer_->Stats();
      bool readers_alive = false;
      for (Worker& w : workers_) {
        if (w.writer) continue;
        if (w.pid == 0 && !w.done) Start(w, -1);  // killed: restart
        if (w.pid == 0 && w.done && stopping && (st.groups_ready > 0 || st.groups_leased > 0)) {
          w.done = false;  // exited while a dead reader's groups were still leased: rejoin
          Start(w, -1);
        }
        readers_alive |= w.pid > 0;
      }
      if (stopping && !readers_alive && st.groups_ready == 0 && st.groups_leased == 0) break;
    }
  }

  void Verify() {
    const ReplayStats st = buffer_->Stats();
    EXPECT_EQ(st.groups_ready, 0);
    EXPECT_EQ(st.groups_leased, 0);
    EXPECT_EQ(st.writes_in_progress, 0) << "a dead writer's frame was never abandoned";
    EXPECT_EQ(st.used_bytes, 0) << "space not reclaimed";
    std::set<std::pair<int, int64_t>> delivered;
    int64_t deliveries = 0;
    for (const Worker& w : workers_) {
      if (w.writer) continue;
      std::ifstream in(Log(w));
      int writer;
      int64_t seq;
      while (in >> writer >> seq) {
        ASSERT_TRUE(seq >= 0 && seq < groups_) << "delivered a group never written";
        delivered.insert({writer, seq});
        ++deliveries;
      }
    }
    for (const Worker& w : workers_) {
      if (!w.writer) continue;
      std::ifstream in(Log(w));
      std::set<int64_t> written;
      int64_t seq;
      while (in >> seq) written.insert(seq);
      EXPECT_EQ(written.size(), static_cast<size_t>(groups_)) << "writer " << w.id;
      for (int64_t s : written) {
        ASSERT_TRUE(delivered.count({w.id, s})) << "writer " << w.id << " group " << s
                                                << " was committed but never delivered";
      }
    }
    duplicates_ = deliveries - static_cast<int64_t>(delivered.size());
    stats_ = st;
  }

  int64_t kills_ = 0, duplicates_ = 0;
  ReplayStats stats_;

 private:
  std::mt19937_64 rng_;
  int64_t groups_;
  std::string dir_, segment_;
  std::unique_ptr<ReplayBuffer> buffer_;
  std::vector<Worker> workers_;
};

TEST(ReplayCrashTest, FourWritersTwoReadersExchange100kRecordsExactly) {
  // Groups hold 1-4 records (2.5 on average): 4 x 10000 groups are ~100k records.
  CrashRun run(4, 2, 10000, 1);
  run.Run(/*kills=*/false);
  run.Verify();
  EXPECT_GE(run.stats_.records_in, 95000);
  EXPECT_EQ(run.duplicates_, 0) << "without failures, every group is delivered exactly once";
  EXPECT_EQ(run.stats_.redelivered, 0);
}

TEST(ReplayCrashTest, RandomKillsOfWritersAndReadersLoseNothingOverManySchedules) {
  int64_t kills = 0, abandoned = 0, redelivered = 0, takeovers = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    SCOPED_TRACE("schedule " + std::to_string(seed));
    CrashRun run(3, 2, 3000, seed);
    run.Run(/*kills=*/true);
    run.Verify();
    if (::testing::Test::HasFailure()) return;
    kills += run.kills_;
    abandoned += run.stats_.abandoned_writes;
    redelivered += run.stats_.redelivered;
    takeovers += run.stats_.lock_takeovers;
  }
  std::printf("kills %lld, abandoned writes %lld, redelivered groups %lld, lock takeovers %lld\n",
              static_cast<long long>(kills), static_cast<long long>(abandoned),
              static_cast<long long>(redelivered), static_cast<long long>(takeovers));
  EXPECT_GT(kills, 200);
  EXPECT_GT(abandoned, 0) << "no writer was killed mid-write: the schedule is too gentle";
  EXPECT_GT(takeovers, 0) << "no lock was taken over from a dead holder";
}

}  // namespace
}  // namespace prl::testing
