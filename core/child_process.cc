#include "core/child_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace prl {

absl::StatusOr<ChildProcess> ChildProcess::Start(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("child process: empty argv");
  int log = -1;
  if (!spec.log_path.empty()) {
    log = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log < 0) {
      return absl::InternalError(
          absl::StrCat("cannot open log ", spec.log_path, ": ", std::strerror(errno)));
    }
  }
  int out[2] = {-1, -1};
  if (spec.capture_stdout && ::pipe2(out, O_CLOEXEC) != 0) {
    if (log >= 0) ::close(log);
    return absl::InternalError(absl::StrCat("pipe for ", spec.name, ": ", std::strerror(errno)));
  }
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {log, out[0], out[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return absl::InternalError(absl::StrCat("fork for ", spec.name, ": ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: die with the supervisor; a parent that died before prctl means we are orphaned.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    // Its own process group: a terminal's Ctrl-C reaches prl run only, which stops the roles
    // in order (actors, learner, coordinator).
    if (spec.own_process_group) ::setpgid(0, 0);
    for (const auto& [name, value] : spec.env) ::setenv(name.c_str(), value.c_str(), 1);
    if (log >= 0) {
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
    }
    if (out[1] >= 0) ::dup2(out[1], STDOUT_FILENO);
    if (spec.search_path) {
      ::execvp(argv[0], argv.data());
    } else {
      ::execv(argv[0], argv.data());
    }
    const std::string message = absl::StrCat("exec ", argv[0], ": ", std::strerror(errno), "\n");
    [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, message.data(), message.size());
    ::_exit(127);
  }
  if (log >= 0) ::close(log);
  if (out[1] >= 0) ::close(out[1]);
  return ChildProcess(spec, pid, out[0]);
}

absl::StatusOr<ChildProcess> ChildProcess::Fork(const std::string& name,
                                                const std::function<int()>& body) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork for ", name, ": ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // as Start: never outlives its parent
    if (::getppid() != parent) ::_exit(127);
    ::_exit(body());
  }
  ChildSpec spec;
  spec.name = name;
  spec.own_process_group = false;
  return ChildProcess(std::move(spec), pid, -1);
}

std::string ChildProcess::ReadStdout() {
  std::string text;
  if (stdout_fd_ < 0) return text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(stdout_fd_);
  stdout_fd_ = -1;
  return text;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : spec_(std::move(other.spec_)),
      pid_(other.pid_),
      stdout_fd_(other.stdout_fd_),
      status_(other.status_) {
  other.pid_ = -1;
  other.stdout_fd_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !status_.has_value()) Stop(absl::ZeroDuration());
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    spec_ = std::move(other.spec_);
    pid_ = other.pid_;
    stdout_fd_ = other.stdout_fd_;
    status_ = other.status_;
    other.pid_ = -1;
    other.stdout_fd_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  if (pid_ > 0 && !status_.has_value()) Stop(absl::ZeroDuration());
}

std::optional<int> ChildProcess::Poll() {
  if (status_.has_value() || pid_ <= 0) return status_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) status_ = status;
  return status_;
}

void ChildProcess::Signal(int signal_number) {
  if (pid_ > 0 && !Poll().has_value()) ::kill(pid_, signal_number);
}

int ChildProcess::Wait() {
  if (pid_ <= 0) return 0;
  if (!Poll().has_value()) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    status_ = status;
  }
  return *status_;
}

int ChildProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return 0;
  if (!Poll().has_value()) {
    if (grace > absl::ZeroDuration()) {
      ::kill(pid_, SIGTERM);
      const absl::Time deadline = absl::Now() + grace;
      while (!Poll().has_value() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    }
    if (!Poll().has_value()) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      status_ = status;
    }
  }
  return *status_;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", ::strsignal(WTERMSIG(status)),
                        ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

}  // namespace prl
