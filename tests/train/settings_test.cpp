// The training settings' one table (train/settings.h) and what is made from it: every setting
// changed from its default survives trainer_state.json's writer and reader; a state written before
// a setting existed reads as the value the table says, and one without a required field fails
// naming it; a resumed run refuses a different must-match setting (naming the field, both values
// and the flag) and takes a may-change one; and `trillion train --help` offers every setting's flag.
#include "train/settings.h"

#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "io/atomic_file.h"
#include "test_support/scratch_dir.h"
#include "train/checkpoint.h"
#include "train/cli_fixture.h"

namespace trillion {
namespace {

// Every setting away from its default: integers + 7, numbers · 1.5 + 0.25, strings the last
// choice other than the default, flags flipped.
TrainSettings changed_settings() {
  TrainSettings changed;
  for (const Setting& setting : training_settings()) {
    std::visit(
        [&](auto member) {
          using Value = std::remove_reference_t<decltype(changed.*member)>;
          if constexpr (std::is_same_v<Value, bool>) {
            changed.*member = !(changed.*member);
          } else if constexpr (std::is_same_v<Value, std::string>) {
            const std::string original = changed.*member;
            for (const std::string& choice : setting.choices)
              if (choice != original) changed.*member = choice;
            if (setting.choices.empty()) changed.*member += "-changed";
          } else if constexpr (std::is_same_v<Value, double>) {
            changed.*member = changed.*member * 1.5 + 0.25;
          } else {
            changed.*member += 7;
          }
        },
        setting.member);
  }
  return changed;
}

TrainerState state_with(const TrainSettings& settings) {
  TrainerState state;
  state.settings = settings;
  state.step = 3;
  return state;
}

std::string write_state(const test::ScratchDir& dir, const nlohmann::json& json) {
  const std::string path = dir.path("trainer_state.json");
  write_file_atomic(path, json.dump(2));
  return path;
}

TEST(TrainingSettings, EverySettingRoundTripsThroughTrainerState) {
  const test::ScratchDir dir;
  const TrainSettings changed = changed_settings();
  const TrainerState read = TrainerState::load(write_state(dir, state_with(changed).to_json()));
  for (const Setting& setting : training_settings()) {
    EXPECT_NE(setting_value(setting, changed), setting_value(setting, TrainSettings{})) << setting.flag;
    EXPECT_EQ(setting_value(setting, read.settings), setting_value(setting, changed)) << setting.flag;
  }
}

TEST(TrainingSettings, OlderStatesReadAsTheTableSaysAndRequiredFieldsAreNamed) {
  const test::ScratchDir dir;
  for (const Setting& setting : training_settings()) {
    nlohmann::json json = state_with(changed_settings()).to_json();
    const std::string field = setting.field;
    const size_t dot = field.find('.');
    nlohmann::json& group = dot == std::string::npos ? json : json[field.substr(0, dot)];
    group.erase(dot == std::string::npos ? field : field.substr(dot + 1));
    const std::string path = write_state(dir, json);
    if (setting.before_it_existed.is_null()) {
      try {
        TrainerState::load(path);
        ADD_FAILURE() << setting.field << ": a state without it was read";
      } catch (const Error& e) {
        const std::string key = dot == std::string::npos ? field : field.substr(dot + 1);
        EXPECT_NE(std::string(e.what()).find("missing field '" + key + "'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      }
    } else {
      EXPECT_EQ(setting_value(setting, TrainerState::load(path).settings), setting.before_it_existed) << setting.field;
    }
  }
}

TEST(TrainingSettings, AResumedRunKeepsMustMatchSettingsAndTakesTheOthers) {
  const TrainSettings saved, given = changed_settings();
  for (const Setting& setting : training_settings()) {
    if (setting.on_resume == OnResume::must_match) {
      try {
        resumed_settings(saved, given, {setting.flag}, "state.json");
        ADD_FAILURE() << setting.flag << ": a different value was accepted";
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("state.json: field '" + std::string(setting.field) + "' is " +
                               setting_text(setting, saved) + " but --" + setting.flag + " " +
                               setting_text(setting, given)),
                  std::string::npos)
            << message;
      }
      EXPECT_EQ(setting_value(setting, resumed_settings(saved, saved, {setting.flag}, "state.json")),
                setting_value(setting, saved));
    } else {
      EXPECT_EQ(setting_value(setting, resumed_settings(saved, given, {setting.flag}, "state.json")),
                setting_value(setting, given))
          << setting.flag;
    }
    // Not given: the saved value.
    EXPECT_EQ(setting_value(setting, resumed_settings(saved, given, {}, "state.json")), setting_value(setting, saved));
  }
}

TEST(TrainingSettings, TheCommandLineOffersEverySetting) {
  const train_test::CommandResult help = train_test::run_cli("train --help");
  ASSERT_EQ(help.status, 0) << help.output;
  for (const Setting& setting : training_settings())
    EXPECT_NE(help.output.find(std::string("--") + setting.flag + " "), std::string::npos) << setting.flag;
}

}  // namespace
}  // namespace trillion
