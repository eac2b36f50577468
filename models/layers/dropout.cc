// dropout {rate}: inverted dropout while training (each element zeroed with probability rate, the
// rest scaled by 1 / (1 - rate)), the identity in evaluation. The mask of a training pass is drawn
// from DeriveSeed(pass seed, layer index) at the element's position in the step's global batch,
// so it does not depend on how that batch is spread over ranks. Kernels: kernels/dropout.h.
#include "common/rng.h"
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* /*params*/) {
  if (!(q.spec.rate >= 0.0 && q.spec.rate < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(q.where, ": rate is ", q.spec.rate, "; it must be in [0, 1)"));
  }
  return q.in;
}

void Forward(const LayerPass& pass, LayerState* layer) {
  CopyUnlessInPlace(pass, *layer);
  if (!pass.training || layer->spec.rate <= 0) return;
  layer->dropout_seed = DeriveSeed(pass.pass_seed, pass.layer_index);
  pass.backend.DropoutForward(layer->out, pass.batch * layer->out_size,
                              static_cast<float>(layer->spec.rate), layer->dropout_seed,
                              pass.dropout_offset);
}

void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  if (!StartElementwiseBackward(pass, layer)) return;
  if (layer.spec.rate <= 0) return;
  pass.backend.DropoutBackward(pass.dx, pass.batch * layer.out_size,
                               static_cast<float>(layer.spec.rate), layer.dropout_seed,
                               pass.dropout_offset);
}

void Describe(const LayerSpec& spec, std::string* line) { absl::StrAppend(line, " ", spec.rate); }

constexpr LayerOption kOptions[] = {
    {.key = "rate", .real = &LayerSpec::rate, .required = true, .min = 0.0, .max = 0.99},
};

}  // namespace

const LayerType kDropout = {
    .kind = LayerKind::kDropout,
    .name = "dropout",
    .init_gain = InitGain::kLookPast,
    .in_place = InPlace::kIfInputFree,
    .options = kOptions,
    .describe = Describe,
    .output_shape = OutputShape,
    .forward = Forward,
    .backward = Backward,
};

}  // namespace huddle::models::layers
