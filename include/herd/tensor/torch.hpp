#ifndef HERD_TENSOR_TORCH_HPP
#define HERD_TENSOR_TORCH_HPP
// Moved to herd/torch/tensor_traits.hpp, with the rest of herd's libtorch support in herd/torch/.
// This path keeps working for programs that include it.

#include <herd/torch/tensor_traits.hpp>

#endif  // HERD_TENSOR_TORCH_HPP
