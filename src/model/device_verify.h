// dsinfer model floor: an optional capability of a Model whose logits live on a device (the
// CUDA model): verify speculative drafts and sample there, so that a step of the batched
// engine with sampled requests brings back token ids only, not vocabulary-wide logit rows.
//
// Data flow: the engine builds one VerifyRequest per batch entry that has logit rows (its
// sampling parameters, drafts, the drafter's q rows and the request's Rng), calls
// forward_verify instead of forward, and reads (accepted, next_token) back; the model
// advances each Rng exactly as spec/verify.h's verify_drafts would have (same uniforms, same
// count), so a request's tokens do not depend on where it was verified. A separate interface
// (found by dynamic_cast, like the CUDA drafter's CudaTarget) keeps Model itself unchanged.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "sampling/sampler.h"

namespace dsinfer {

// Check n_drafts drafts against the entry's logit rows first_row .. first_row + n_drafts
// (indices into the entry's logit_rows) under `params`; q: the drafter's distributions,
// row-major [n_drafts, vocab] (nullptr: point masses on the drafts). n_drafts == 0: plain
// sampling (or the argmax) of row first_row.
struct VerifyRequest {
  int entry = 0;
  int first_row = 0;
  SamplingParams params;
  const int32_t* drafts = nullptr;
  int n_drafts = 0;
  const float* q = nullptr;
  Rng* rng = nullptr;
  int accepted = 0;        // out
  int32_t next_token = 0;  // out
};

class DeviceVerifier {
 public:
  virtual ~DeviceVerifier() = default;
  // false when switched off (DSINFER_CUDA_SAMPLING=0 for the CUDA model): the engine then
  // copies logit rows back and verifies on the host.
  virtual bool verifies_on_device() const = 0;
  // The forward (as Model::forward, captured layers included; out.logits stays empty), then
  // every request verified on the device.
  virtual void forward_verify(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out,
                              std::vector<VerifyRequest>& reqs) = 0;
};

}  // namespace dsinfer
