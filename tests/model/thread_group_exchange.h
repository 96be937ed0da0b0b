// A context-parallel group of threads in one process (model/context_parallel.h's
// ContextExchange) for the model tests: each rank's contribution goes to a shared host slot,
// read once every rank has written (two barriers per call). Tensors may live in host memory or
// on a GPU (copied through the host with CopyBytes, so threads sharing one GPU can form a group
// NCCL would refuse); AllGather, AllToAll and Shift move any dtype, ReduceScatter sums f32.
#pragma once

#include <barrier>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/buffer.h"
#include "core/status_macros.h"
#include "model/context_parallel.h"

namespace prl::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), barrier_(size), slots_(size), host_(size) {}

  class Exchange final : public ContextExchange {
   public:
    Exchange(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_->size_; }

    absl::Status AllGather(const Tensor& shard, const Tensor& out) override {
      PRL_RETURN_IF_ERROR(group_->Put(rank_, shard));
      for (int r = 0; r < size(); ++r) {
        PRL_RETURN_IF_ERROR(Get(out, r * shard.bytes(), r, 0, shard.bytes()));
      }
      group_->barrier_.arrive_and_wait();
      return absl::OkStatus();
    }
    absl::Status ReduceScatter(const Tensor& in, const Tensor& shard) override {
      PRL_RETURN_IF_ERROR(group_->Put(rank_, in));
      const int64_t n = shard.numel();
      std::vector<float> sum(n, 0.0f);
      for (int r = 0; r < size(); ++r) {
        const float* part = reinterpret_cast<const float*>(group_->slots_[r].data()) + rank_ * n;
        for (int64_t i = 0; i < n; ++i) sum[i] += part[i];
      }
      group_->barrier_.arrive_and_wait();
      return CopyBytes(shard.data, shard.device, sum.data(), Device::Cpu(), n * sizeof(float));
    }
    absl::Status AllToAll(const Tensor& in, const Tensor& out) override {
      PRL_RETURN_IF_ERROR(group_->Put(rank_, in));
      const size_t block = in.bytes() / size();
      for (int r = 0; r < size(); ++r) {
        PRL_RETURN_IF_ERROR(Get(out, r * block, r, rank_ * block, block));
      }
      group_->barrier_.arrive_and_wait();
      return absl::OkStatus();
    }
    absl::Status Shift(const Tensor& send, const Tensor& recv) override {
      PRL_RETURN_IF_ERROR(group_->Put(rank_, send));
      PRL_RETURN_IF_ERROR(Get(recv, 0, (rank_ + size() - 1) % size(), 0, recv.bytes()));
      group_->barrier_.arrive_and_wait();
      return absl::OkStatus();
    }
    absl::Status AllReduceHost(absl::Span<double> values) override {
      group_->host_[rank_].assign(values.begin(), values.end());
      group_->barrier_.arrive_and_wait();
      for (size_t i = 0; i < values.size(); ++i) {
        double sum = 0.0;
        for (int r = 0; r < size(); ++r) sum += group_->host_[r][i];
        values[i] = sum;
      }
      group_->barrier_.arrive_and_wait();
      return absl::OkStatus();
    }

   private:
    // out's bytes [at, at + bytes) = rank r's slot's [from, from + bytes).
    absl::Status Get(const Tensor& out, size_t at, int r, size_t from, size_t bytes) {
      return CopyBytes(static_cast<uint8_t*>(out.data) + at, out.device,
                       group_->slots_[r].data() + from, Device::Cpu(), bytes);
    }
    ThreadGroup* group_;
    int rank_;
  };

 private:
  // Rank `rank`'s data in its slot, then every rank's are there.
  absl::Status Put(int rank, const Tensor& data) {
    slots_[rank].resize(data.bytes());
    const absl::Status copied =
        CopyBytes(slots_[rank].data(), Device::Cpu(), data.data, data.device, data.bytes());
    barrier_.arrive_and_wait();
    return copied;
  }

  int size_;
  std::barrier<> barrier_;
  std::vector<std::vector<uint8_t>> slots_;
  std::vector<std::vector<double>> host_;
};

}  // namespace prl::testing
