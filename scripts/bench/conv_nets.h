// The convolution layers the per-layer micro-batching benchmarks measure: the distinct convolution
// shapes of torchvision's AlexNet, ResNet-50 and VGG-16, with how often each occurs. Shared by
// microbatch_layers.cpp (legacy API) and graph_layers.cpp (graph API), so both measure the same set.
#pragma once

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

namespace vcudnn::bench {

struct Layer {
  std::string name;  // e.g. "conv2 64->192 5x5/1 @27"
  int c, k, r, stride, pad, hw;
  int count = 1;       // occurrences of this shape in the network
  bool first = false;  // the network's first convolution: no backward-data (its input needs no gradient)
};

struct Net {
  std::string name;
  int batch;
  std::vector<Layer> layers;
};

inline int out_dim(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

// Adds a convolution unless the same shape is already there (then counts it).
inline void add_conv(Net& net, const std::string& where, int c, int k, int r, int stride, int pad, int hw,
                     bool first = false) {
  for (auto& l : net.layers) {
    if (std::tie(l.c, l.k, l.r, l.stride, l.pad, l.hw) == std::tie(c, k, r, stride, pad, hw)) {
      ++l.count;
      l.first = l.first && first;
      return;
    }
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %d->%d %dx%d/%d @%d", where.c_str(), c, k, r, r, stride, hw);
  net.layers.push_back(Layer{buf, c, k, r, stride, pad, hw, 1, first});
}

// torchvision.models.alexnet.
inline Net alexnet() {
  Net n{"alexnet", 256, {}};
  add_conv(n, "conv1", 3, 64, 11, 4, 2, 224, true);
  add_conv(n, "conv2", 64, 192, 5, 1, 2, 27);
  add_conv(n, "conv3", 192, 384, 3, 1, 1, 13);
  add_conv(n, "conv4", 384, 256, 3, 1, 1, 13);
  add_conv(n, "conv5", 256, 256, 3, 1, 1, 13);
  return n;
}

// torchvision.models.resnet50 (v1.5: the stride sits on the 3x3), distinct shapes, downsample 1x1s included.
inline Net resnet50() {
  Net n{"resnet50", 256, {}};
  add_conv(n, "conv1", 3, 64, 7, 2, 3, 224, true);
  int in = 64, hw = out_dim(out_dim(224, 7, 2, 3), 3, 2, 1);  // conv1, then maxpool 3x3/2 pad 1: 56
  const int widths[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
  for (int l = 0; l < 4; ++l) {
    const int width = widths[l], out = width * 4;
    for (int b = 0; b < blocks[l]; ++b) {
      const int stride = (b == 0 && l > 0) ? 2 : 1;
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(b) + ".";
      add_conv(n, p + "conv1", in, width, 1, 1, 0, hw);
      add_conv(n, p + "conv2", width, width, 3, stride, 1, hw);
      const int hw2 = out_dim(hw, 3, stride, 1);
      add_conv(n, p + "conv3", width, out, 1, 1, 0, hw2);
      if (b == 0) add_conv(n, p + "downsample", in, out, 1, stride, 0, hw);
      in = out;
      hw = hw2;
    }
  }
  return n;
}

// torchvision.models.vgg16 (configuration D), distinct shapes.
inline Net vgg16() {
  Net n{"vgg16", 64, {}};
  const int cfg[5][3] = {{64, 64, 0}, {128, 128, 0}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}};
  int in = 3, hw = 224;
  for (int b = 0; b < 5; ++b) {
    for (int i = 0; i < 3 && cfg[b][i]; ++i) {
      add_conv(n, "conv" + std::to_string(b + 1) + "_" + std::to_string(i + 1), in, cfg[b][i], 3, 1, 1, hw,
               b == 0 && i == 0);
      in = cfg[b][i];
    }
    hw /= 2;
  }
  return n;
}

}  // namespace vcudnn::bench
