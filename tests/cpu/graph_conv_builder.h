// A graph-API convolution of one 3x3 layer (backend_shadow.h's GraphConv) for recorder tests:
// `channels` in and out, 8x16x16 maps, fake pointers; `engine` names the engine's global index.
#pragma once

#include <cudnn.h>

#include <cstdint>

#include "runtime/backend_shadow.h"

namespace vcudnn::test {

inline GraphConv conv_of(ConvKind kind, int64_t channels, int64_t engine) {
  GraphConv g;
  g.kind = kind;
  ConvLayer& l = g.layer;
  l.x = {CUDNN_DATA_FLOAT, 4, {8, channels, 16, 16}, {channels * 256, 256, 16, 1}};
  l.y = {CUDNN_DATA_FLOAT, 4, {8, channels, 16, 16}, {channels * 256, 256, 16, 1}};
  l.w = {CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, {channels, channels, 3, 3}};
  l.conv.spatial_dims = 2;
  l.conv.pad = {1, 1};
  l.conv.stride = {1, 1};
  l.conv.dilation = {1, 1};
  l.conv.mode = CUDNN_CROSS_CORRELATION;
  l.conv.compute_type = CUDNN_DATA_FLOAT;
  l.conv.math_type = -1;
  g.x = 0x7000000000 + static_cast<uint64_t>(channels) * 0x1000;
  g.w = g.x + 0x100;
  g.y = g.x + 0x200;
  g.workspace = 0x7100000000;
  g.workspace_bytes = 4096 * channels;
  g.engine = engine;
  return g;
}

}  // namespace vcudnn::test
