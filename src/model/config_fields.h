// Internal to model/config*.cpp: typed, source-naming access to a config object's fields, and the
// two directions config.json's one field declaration (`describe_config`, config.cpp) runs in:
// ConfigReader parses and validates, ConfigWriter writes. A field whose JSON form is not one value
// (RoPE, layer types, the FFN placement, Kimi-Linear's linear_attn_config) is a struct with its
// `read` and `write` side by side.
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
  // Fields present (not null) that nothing asked for, then those of nested objects (add_unread).
  std::vector<std::string> unread() const {
    std::vector<std::string> names;
    for (const auto& [name, value] : json_.items()) {
      bool metadata = false;
      for (const char* field : kMetadataFields) metadata = metadata || name == field;
      if (!value.is_null() && !metadata && read_.count(name) == 0) names.push_back(name);
    }
    names.insert(names.end(), nested_unread_.begin(), nested_unread_.end());
    return names;
  }
  // A field of a nested object that its reader did not read ("linear_attn_config.future").
  void add_unread(std::string name) const { nested_unread_.push_back(std::move(name)); }
  // The one of `names` present; several present must agree (aliases of one field).
  const char* alias(const std::vector<const char*>& names) const {
    const char* found = nullptr;
    for (const char* name : names) {
      if (!has(name)) continue;
      if (found != nullptr && json_.at(name) != json_.at(found))
        fail_field(name, str_cat("got ", json_.at(name).dump(), "; expected it to equal ", found, " = ",
                                 json_.at(found).dump()));
      if (found == nullptr) found = name;
    }
    return found != nullptr ? found : names.front();
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
  mutable std::vector<std::string> nested_unread_;
};

// How an integer field is checked when read.
enum class IntegerRule {
  required_positive,  // must be present and > 0
  positive,           // > 0 when present (the default is not checked)
  non_negative,       // >= 0, the default included
};
// How a number field is checked when read.
enum class NumberRule { any, positive /* > 0 and finite, the default included */ };

// A field's JSON names: read under any of `read` (aliases, which must agree when several are
// present), written under `written` (the first unless a family names it otherwise).
struct FieldNames {
  FieldNames(const char* name) : read{name}, written(name) {}  // NOLINT: a lone name is the common case
  FieldNames(std::initializer_list<const char*> names, const char* written_as = nullptr)
      : read(names), written(written_as != nullptr ? written_as : *names.begin()) {}
  std::vector<const char*> read;
  const char* written;
};

// Runs the field declaration in the reading direction: fills a ModelConfig from a config object,
// with each field's default when absent, and fails on the first field that breaks its rule.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& json, const std::string& source) : fields_(json, source) {}

  // Each returns the name the value was read under (an alias, when that is what the file has).
  const char* integer(int64_t& value, const FieldNames& names, IntegerRule rule) {
    return integer(value, names, rule, value);
  }
  const char* integer(int64_t& value, const FieldNames& names, IntegerRule rule, int64_t fallback) {
    const char* name = fields_.alias(names.read);
    switch (rule) {
      case IntegerRule::required_positive: value = fields_.required_positive(name); break;
      case IntegerRule::positive: value = fields_.positive(name, fallback); break;
      case IntegerRule::non_negative: value = fields_.non_negative(name, fallback); break;
    }
    return name;
  }
  // transformers' None (JSON null) reads as 0: "not used" (q_lora_rank: one q_proj).
  void nullable_positive(int64_t& value, const char* name, int64_t fallback) {
    value = fields_.is_null(name) ? 0 : fields_.positive(name, fallback);
  }
  void number(double& value, const FieldNames& names, NumberRule rule) { number(value, names, rule, value); }
  void number(double& value, const FieldNames& names, NumberRule rule, double fallback) {
    const char* name = fields_.alias(names.read);
    value = rule == NumberRule::positive ? fields_.positive_number(name, fallback) : fields_.number(name, fallback);
  }
  void boolean(bool& value, const FieldNames& names) { boolean(value, names, value); }
  void boolean(bool& value, const FieldNames& names, bool fallback) {
    value = fields_.boolean(fields_.alias(names.read), fallback);
  }
  // A setting the family fixes to true when `fixed`: then read and ignored, as transformers ignores
  // it, and not written.
  void boolean_unless_fixed(bool& value, const char* name, bool fallback, bool fixed) {
    value = fields_.boolean(name, fallback) || fixed;
  }
  void string(std::string& value, const char* name) { value = fields_.string(name, value); }
  // One of `choices`, written as name_of(choice).
  template <class Enum>
  void choice(Enum& value, const char* name, std::initializer_list<Enum> choices, const char* (*name_of)(Enum)) {
    const std::string text = fields_.string(name, name_of(value));
    std::vector<std::string> names;
    for (Enum option : choices) {
      if (text == name_of(option)) return void(value = option);
      names.push_back(name_of(option));
    }
    fields_.fail_field(name, str_cat("got \"", text, "\"; expected ", one_of(names)));
  }
  // A field whose JSON form is not one value: Field::read and Field::write.
  template <class Field>
  void structured(const Family& family, ModelConfig& c) { Field::read(fields_, family, c); }
  // A rule across fields: fails with field "NAME": message() unless `ok`.
  template <class Message>
  void require(bool ok, const char* field, const Message& message) {
    if (!ok) fields_.fail_field(field, message());
  }
  // Checks of the file itself (fields that are only checked, never kept).
  template <class Check>
  void check(const Check& check) { check(fields_); }

  std::vector<std::string> unread() const { return fields_.unread(); }

 private:
  FieldReader fields_;
};

// Runs the field declaration in the writing direction: every field the config has, under its
// written name, in the form ConfigReader reads back as the same config.
class ConfigWriter {
 public:
  explicit ConfigWriter(nlohmann::json& json) : json_(json) {}

  const char* integer(const int64_t& value, const FieldNames& names, IntegerRule, int64_t = 0) {
    json_[names.written] = value;
    return names.written;
  }
  void nullable_positive(const int64_t& value, const char* name, int64_t) {
    json_[name] = value > 0 ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  void number(const double& value, const FieldNames& names, NumberRule, double = 0.0) { json_[names.written] = value; }
  void boolean(const bool& value, const FieldNames& names, bool = false) { json_[names.written] = value; }
  void boolean_unless_fixed(const bool& value, const char* name, bool, bool fixed) {
    if (!fixed) json_[name] = value;
  }
  void string(const std::string& value, const char* name) { json_[name] = value; }
  template <class Enum>
  void choice(const Enum& value, const char* name, std::initializer_list<Enum>, const char* (*name_of)(Enum)) {
    json_[name] = name_of(value);
  }
  template <class Field>
  void structured(const Family& family, const ModelConfig& c) { Field::write(json_, family, c); }
  template <class Message>
  void require(bool, const char*, const Message&) {}
  template <class Check>
  void check(const Check&) {}

 private:
  nlohmann::json& json_;
};

// The structured fields (config_attention.cpp).
// RoPE: transformers 5.x's `rope_parameters` dict and the older top-level fields (rope_theta,
// partial_rotary_factor, rope_scaling); when several give a value they must agree. Written as
// rope_parameters. Plain RoPE and YaRN are built.
struct RopeParameters {
  static void read(const FieldReader& fields, const Family& family, ModelConfig& c);
  static void write(nlohmann::json& json, const Family& family, const ModelConfig& c);
};
// Kimi-Linear's names for its delta-attention layers (one head count and head dim for q, k and v)
// and its checkpoint form `linear_attn_config` {full_attn_layers, kda_layers (1-indexed), head_dim,
// num_heads, short_conv_kernel_size}, which overrides them and sets layer_types, or, when
// layer_types is given (it names the sparse layers among full_attn_layers), must agree with it.
struct KimiLinearAttention {
  static void read(const FieldReader& fields, const Family& family, ModelConfig& c);
  static void write(nlohmann::json& json, const Family& family, const ModelConfig& c);
};

}  // namespace trillion::config_detail
