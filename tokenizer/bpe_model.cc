#include "tokenizer/bpe_model.h"

#include <queue>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer {

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& config,
                                                             const JsonPath& path) {
  if (!config.is_object()) return TypeError(path, "a model object", config);
  PRL_ASSIGN_OR_RETURN(const std::string type, GetStringOr(config, "type", path, "BPE"));
  if (type != "BPE") return Unsupported(path.Key("type"), type, "BPE");
  if (config.contains("dropout") && !config["dropout"].is_null() &&
      !(config["dropout"].is_number() && config["dropout"].get<double>() == 0.0)) {
    return Unsupported(path.Key("dropout"), Describe(config["dropout"]), "null");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    PRL_ASSIGN_OR_RETURN(const std::string value, GetStringOr(config, affix, path, ""));
    if (!value.empty()) return Unsupported(path.Key(affix), value, "null or \"\"");
  }
  std::unique_ptr<BpeModel> model(new BpeModel());
  PRL_ASSIGN_OR_RETURN(model->fuse_unk_, GetBoolOr(config, "fuse_unk", path, false));
  PRL_ASSIGN_OR_RETURN(model->byte_fallback_, GetBoolOr(config, "byte_fallback", path, false));
  PRL_ASSIGN_OR_RETURN(model->ignore_merges_, GetBoolOr(config, "ignore_merges", path, false));
  PRL_RETURN_IF_ERROR(model->LoadVocab(config, path));
  PRL_RETURN_IF_ERROR(model->LoadMerges(config, path));
  PRL_ASSIGN_OR_RETURN(const std::string unk, GetStringOr(config, "unk_token", path, ""));
  if (!unk.empty()) {
    model->unk_id_ = model->TokenToId(unk);
    if (model->unk_id_ < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path.Key("unk_token").ToString(), ": \"", unk,
                                                     "\" is not in the vocabulary"));
    }
  }
  return model;
}

absl::Status BpeModel::LoadVocab(const nlohmann::json& config, const JsonPath& path) {
  PRL_ASSIGN_OR_RETURN(const nlohmann::json* vocab, GetObject(config, "vocab", path));
  token_to_id_.reserve(vocab->size());
  for (const auto& [token, value] : vocab->items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > (1 << 30)) {
      return TypeError(path.Key("vocab").Key(token), "a token id", value);
    }
    const int32_t id = static_cast<int32_t>(value.get<int64_t>());
    if (static_cast<size_t>(id) >= id_to_token_.size()) {
      id_to_token_.resize(id + 1);
      id_used_.resize(id + 1, false);
    }
    if (id_used_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(path.Key("vocab").ToString(), ": id ", id,
                                                     " is given to both \"", id_to_token_[id],
                                                     "\" and \"", token, "\""));
    }
    id_used_[id] = true;
    id_to_token_[id] = token;
    token_to_id_[token] = id;
    char32_t cp;
    if (!token.empty() && static_cast<size_t>(DecodeUtf8(token, 0, &cp)) == token.size()) {
      char_to_id_[cp] = id;
    }
  }
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) byte_ids_[b] = TokenToId(absl::StrFormat("<0x%02X>", b));
  return absl::OkStatus();
}

absl::Status BpeModel::LoadMerges(const nlohmann::json& config, const JsonPath& path) {
  PRL_ASSIGN_OR_RETURN(const nlohmann::json* merges, GetArray(config, "merges", path));
  merges_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const nlohmann::json& m = (*merges)[i];
    const JsonPath where = path.Key("merges").Index(i);
    std::string left, right;
    // tokenizers < 0.20 writes "left right", later versions ["left", "right"].
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return TypeError(where, "\"left right\" (two tokens)", m);
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return TypeError(where, "a merge (\"left right\" or [left, right])", m);
    }
    const int32_t a = TokenToId(left), b = TokenToId(right), r = TokenToId(left + right);
    if (a < 0 || b < 0 || r < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where.ToString(), ": merge ", Describe(m),
                                                     " needs \"",
                                                     a < 0   ? left
                                                     : b < 0 ? right
                                                             : left + right,
                                                     "\", which is not in the vocabulary"));
    }
    // The first occurrence of a pair keeps its rank (as in tokenizers).
    merges_.try_emplace(PairKey(a, b), Merge{static_cast<int32_t>(i), r});
  }
  return absl::OkStatus();
}

int32_t BpeModel::TokenToId(absl::string_view token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_used_[id]) return nullptr;
  return &id_to_token_[id];
}

absl::Status BpeModel::InitialSymbols(absl::string_view word, std::vector<int32_t>* symbols) const {
  char32_t cp;
  for (size_t pos = 0; pos < word.size();) {
    const int len = DecodeUtf8(word, pos, &cp);
    auto it = char_to_id_.find(cp);
    if (it != char_to_id_.end()) {
      symbols->push_back(it->second);
    } else {
      bool bytes_known = byte_fallback_;
      for (int i = 0; bytes_known && i < len; ++i) {
        bytes_known = byte_ids_[static_cast<unsigned char>(word[pos + i])] >= 0;
      }
      if (bytes_known) {
        for (int i = 0; i < len; ++i) {
          symbols->push_back(byte_ids_[static_cast<unsigned char>(word[pos + i])]);
        }
      } else if (unk_id_ < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("character \"", word.substr(pos, len),
                         "\" is not in the vocabulary and the model has no unk_token"));
      } else if (!(fuse_unk_ && !symbols->empty() && symbols->back() == unk_id_)) {
        symbols->push_back(unk_id_);
      }
    }
    pos += len;
  }
  return absl::OkStatus();
}

void BpeModel::ApplyMerges(std::vector<int32_t>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  // Symbol i covers a run of the initial symbols; prev/next link the live ones.
  std::vector<int32_t>& id = *symbols;
  std::vector<int> prev(n), next(n);
  std::vector<bool> live(n, true);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank;
    int pos;  // the left symbol
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(id[pos], id[next[pos]]));
    if (it != merges_.end()) queue.push({it->second.rank, pos});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int right = next[top.pos];
    if (!live[top.pos] || right < 0) continue;
    auto it = merges_.find(PairKey(id[top.pos], id[right]));
    if (it == merges_.end() || it->second.rank != top.rank) continue;  // stale entry
    id[top.pos] = it->second.result;
    live[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  int out = 0;
  for (int i = 0; i >= 0; i = next[i]) id[out++] = id[i];
  id.resize(out);
}

absl::Status BpeModel::Encode(absl::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    const int32_t whole = TokenToId(word);
    if (whole >= 0) {
      ids->push_back(whole);
      return absl::OkStatus();
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  CacheShard& shard = cache_[absl::HashOf(word) % cache_.size()];
  if (cacheable) {
    absl::MutexLock lock(&shard.mu);
    auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  PRL_RETURN_IF_ERROR(InitialSymbols(word, &symbols));
  ApplyMerges(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    absl::MutexLock lock(&shard.mu);
    // A full shard keeps what it has (no eviction), like tokenizers' cache.
    if (shard.words.size() < kCacheCapacityPerShard) shard.words.emplace(word, std::move(symbols));
  }
  return absl::OkStatus();
}

}  // namespace prl::tokenizer
