// LoRA's frozen base in bf16 only (Model::keep_frozen_base_in_bf16_only): the bf16 copy of the
// float parameters that bf16 products read, and the float pages of the frozen linear weights
// released beside it (core/memory.h ReleasedPages). Why pages: the parameters are one buffer whose
// offsets the table, FSDP and the checkpoints share; releasing whole pages of the frozen runs keeps
// that layout and gives their bytes back. docs/architecture.md, "LoRA".
#include <algorithm>
#include <type_traits>

#include "core/bf16.h"
#include "core/error.h"
#include "model/model.h"
#include "model/model_impl.h"

namespace trillion {

std::vector<std::pair<int64_t, int64_t>> bf16_only_base_ranges(const ParamTable& table) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const int64_t page = page_bytes() / int64_t(sizeof(float));  // elements
  if (!is_page_mapped(table.total_size() * int64_t(sizeof(float)))) return ranges;
  std::vector<const ParamSpec*> by_offset;
  for (const ParamSpec& spec : table.entries()) by_offset.push_back(&spec);
  std::sort(by_offset.begin(), by_offset.end(), [](const ParamSpec* a, const ParamSpec* b) { return a->offset < b->offset; });
  int64_t run_begin = -1, run_end = -1;  // the current run of frozen tensors that only products read
  const auto close_run = [&] {
    const int64_t begin = (run_begin + page - 1) / page * page, end = run_end / page * page;
    if (run_begin >= 0 && end > begin) ranges.push_back({begin, end});
    run_begin = -1;
  };
  for (const ParamSpec* spec : by_offset) {
    if (!held_in_bf16_only(*spec)) {
      close_run();
      continue;
    }
    if (run_begin < 0) run_begin = spec->offset;
    run_end = spec->offset + spec->numel();
  }
  close_run();
  return ranges;
}

template <class T>
void Model<T>::keep_frozen_base_in_bf16_only() {
  TRILLION_CHECK((std::is_same_v<T, float>) && impl_->config.lora != nullptr && !impl_->hooks.before_forward &&
                     matmul_precision() == MatmulPrecision::bf16,
                 "a bf16-only base is a float LoRA model's under the bf16 precision on one rank");
  impl_->bf16_only_base = true;
  impl_->refresh_bf16_params();  // the copy made and the pages released now, before the first step
}

template <class T>
int64_t Model<T>::released_base_bytes() const { return impl_->released_pages.bytes(); }

template <class T>
void Model<T>::Impl::refresh_bf16_params(bool may_release) {
  if constexpr (std::is_same_v<T, float>) {
    if (matmul_precision() != MatmulPrecision::bf16 || hooks.before_forward) {
      restore_base();
      return bf16_params.reset();
    }
    if (!bf16_params) {
      bf16_params.emplace(params.data(), params.size());
    } else {
      int64_t from = 0;  // the ranges between released ones
      for (const auto& [begin, end] : released_ranges) {
        bf16_params->refresh(from, begin);
        from = end;
      }
      bf16_params->refresh(from, params.size());
    }
    if (!may_release || !bf16_only_base || !released_ranges.empty()) return;
    // The base's linear weights become their bf16 values, the copy's, also where a page holds
    // other tensors too and stays: what decoding's float reads and a checkpoint then see.
    for (const ParamSpec& spec : table.entries())
      if (held_in_bf16_only(spec))
        to_float(bf16_params->data() + spec.offset, params.data() + spec.offset, spec.numel());
    released_ranges = bf16_only_base_ranges(table);
    for (const auto& [begin, end] : released_ranges)
      released_pages.release(params.data() + begin, params.data() + end, Tier::fast);
  }
}

template <class T>
void Model<T>::Impl::restore_base() {
  if constexpr (std::is_same_v<T, float>) {
    if (released_ranges.empty()) return;
    released_pages.restore();
    for (const auto& [begin, end] : released_ranges)
      to_float_threaded(bf16_params->data() + begin, params.data() + begin, end - begin);
    released_ranges.clear();
  }
}

template void Model<float>::keep_frozen_base_in_bf16_only();
template int64_t Model<float>::released_base_bytes() const;
template void Model<float>::Impl::refresh_bf16_params(bool);
template void Model<float>::Impl::restore_base();
template void Model<double>::keep_frozen_base_in_bf16_only();
template int64_t Model<double>::released_base_bytes() const;
template void Model<double>::Impl::refresh_bf16_params(bool);
template void Model<double>::Impl::restore_base();

}  // namespace trillion
