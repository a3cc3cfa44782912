// Compiled for every architecture nvcc knows (CUDA_ARCHITECTURES all: 12 in CUDA 13), which
// names the configuration namespace after all of them; the test checks the name it prints.
// Only the header that names the namespace: the whole of herd for 12 GPUs takes minutes.
#include <herd/core/config.hpp>

#include <cstdio>

int main() { std::printf("%s\n", herd::configuration()); }
