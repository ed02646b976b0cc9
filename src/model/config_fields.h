// Internal to model/config*.cpp: typed, source-naming access to a config object's fields, and the
// parsers config.cpp delegates to config_attention.cpp (RoPE and its YaRN scaling, multi-head latent
// attention, Kimi-Linear's linear-attention names).
#pragma once

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/family.h"

namespace trillion::config_detail {

// Fields that describe the file or the runtime, not the model: never listed as unread.
constexpr const char* kMetadataFields[] = {"architectures", "dtype", "torch_dtype", "transformers_version",
                                           "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id",
                                           "use_cache", "output_attentions", "output_hidden_states", "return_dict"};

// The largest integer a config field may hold (INT32_MAX).
constexpr int64_t kMaxConfigInteger = 2147483647;

// Typed access to the fields of one config object; every failure names the source and the field.
class FieldReader {
 public:
  FieldReader(const nlohmann::json& json, const std::string& source) : json_(json), source_(source) {}

  bool has(const char* name) const {
    read_.insert(name);
    return json_.contains(name) && !json_.at(name).is_null();
  }
  // Present with the value null (transformers' None), as opposed to absent.
  bool is_null(const char* name) const {
    read_.insert(name);
    return json_.contains(name) && json_.at(name).is_null();
  }
  // Fields present (not null) that nothing asked for.
  std::vector<std::string> unread() const {
    std::vector<std::string> names;
    for (const auto& [name, value] : json_.items()) {
      bool metadata = false;
      for (const char* field : kMetadataFields) metadata = metadata || name == field;
      if (!value.is_null() && !metadata && read_.count(name) == 0) names.push_back(name);
    }
    return names;
  }
  // The one of `names` present; several present must agree (aliases of one field).
  const char* alias(std::initializer_list<const char*> names) const {
    const char* found = nullptr;
    for (const char* name : names) {
      if (!has(name)) continue;
      if (found != nullptr && json_.at(name) != json_.at(found))
        fail_field(name, str_cat("got ", json_.at(name).dump(), "; expected it to equal ", found, " = ",
                                 json_.at(found).dump()));
      if (found == nullptr) found = name;
    }
    return found != nullptr ? found : *names.begin();
  }

  [[noreturn]] void fail_field(const std::string& name, const std::string& problem) const {
    fail(source_, ": field \"", name, "\": ", problem);
  }
  [[noreturn]] void fail_element(const std::string& name, size_t index, const std::string& problem) const {
    fail(source_, ": field \"", name, "\"[", index, "]: ", problem);
  }

  int64_t integer(const char* name, int64_t fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_number_integer()) fail_field(name, str_cat("got ", value.dump(), "; expected an integer"));
    // Every size, count and id of a model fits int32 (token ids, key indices); larger is absurd and
    // would overflow the products of sizes.
    if (value.is_number_unsigned() ? value.get<uint64_t>() > uint64_t(kMaxConfigInteger)
                                   : value.get<int64_t>() > kMaxConfigInteger)
      fail_field(name, str_cat("got ", value.dump(), "; expected at most ", kMaxConfigInteger));
    return value.get<int64_t>();
  }
  int64_t required_positive(const char* name) const {
    if (!has(name)) fail_field(name, "missing; expected a positive integer");
    return positive(name, 0);
  }
  int64_t positive(const char* name, int64_t fallback) const {
    int64_t value = integer(name, fallback);
    if (has(name) && value <= 0) fail_field(name, str_cat("got ", value, "; expected a positive integer"));
    return value;
  }
  int64_t non_negative(const char* name, int64_t fallback) const {
    int64_t value = integer(name, fallback);
    if (value < 0) fail_field(name, str_cat("got ", value, "; expected a non-negative integer"));
    return value;
  }
  double number(const char* name, double fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_number()) fail_field(name, str_cat("got ", value.dump(), "; expected a number"));
    return value.get<double>();
  }
  double positive_number(const char* name, double fallback) const {
    double value = number(name, fallback);
    if (!(value > 0.0) || !std::isfinite(value))
      fail_field(name, str_cat("got ", value, "; expected a positive number"));
    return value;
  }
  bool boolean(const char* name, bool fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_boolean()) fail_field(name, str_cat("got ", value.dump(), "; expected true or false"));
    return value.get<bool>();
  }
  std::string string(const char* name, const std::string& fallback) const {
    if (!has(name)) return fallback;
    const nlohmann::json& value = json_.at(name);
    if (!value.is_string()) fail_field(name, str_cat("got ", value.dump(), "; expected a string"));
    return value.get<std::string>();
  }
  const nlohmann::json& at(const char* name) const {
    read_.insert(name);
    return json_.at(name);
  }
  std::vector<int64_t> integer_list(const char* name) const {
    std::vector<int64_t> values;
    if (!has(name)) return values;
    const nlohmann::json& list = json_.at(name);
    if (!list.is_array()) fail_field(name, str_cat("got ", list.dump(), "; expected an array of integers"));
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_number_integer()) fail_element(name, i, str_cat("got ", list[i].dump(), "; expected an integer"));
      values.push_back(list[i].get<int64_t>());
    }
    return values;
  }
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json& json_;
  const std::string& source_;
  mutable std::set<std::string> read_;
};

// RoPE settings: transformers 5.x's `rope_parameters` dict and the older top-level fields; when
// both give a value they must agree. Plain RoPE and YaRN are built.
void parse_rope(const FieldReader& fields, const Family& family, ModelConfig& c);
// Multi-head latent attention's dims (transformers' DeepseekV3Config / KimiLinearConfig defaults when
// absent; q_lora_rank null means one q_proj).
void parse_mla(const FieldReader& fields, const Family& family, ModelConfig& c);
// Kimi-Linear's delta-attention names and its checkpoint form `linear_attn_config`; returns the keys
// of linear_attn_config it did not read.
std::vector<std::string> parse_kimi_linear_attention(const FieldReader& fields, ModelConfig& c);
// rope_parameters as transformers 5.x writes it.
nlohmann::json rope_json(const ModelConfig& c);

}  // namespace trillion::config_detail
