#include "coordinator/list_client.h"

#include <chrono>

#include "rpc/grpc_util.h"

namespace prl::coordinator {

absl::StatusOr<std::vector<prl::v1::PromptSetStatus>> ListAllPromptSets(
    prl::v1::PromptService::Stub& stub, absl::Duration timeout) {
  std::vector<prl::v1::PromptSetStatus> sets;
  prl::v1::ListPromptSetsRequest request;
  request.set_page_size(1000);
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    prl::v1::ListPromptSetsResponse page;
    const absl::Status status = rpc::FromGrpcStatus(stub.ListPromptSets(&ctx, request, &page));
    if (!status.ok()) return status;
    for (prl::v1::PromptSetStatus& s : *page.mutable_prompt_sets()) sets.push_back(std::move(s));
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return sets;
}

}  // namespace prl::coordinator
