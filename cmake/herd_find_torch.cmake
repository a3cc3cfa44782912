# herd_find_torch(): find_package(Torch QUIET) for herd's own libtorch programs. A CUDA build of
# libtorch (pip's wheel) sets CMAKE_CUDA_STANDARD in the calling directory, which would ask CMake
# for a CUDA 20 dialect it cannot spell for nvcc (3.25) on herd's CUDA targets in the same
# folders; herd's CUDA targets set their standard themselves (herd::nccl passes -std=c++20).
macro(herd_find_torch)
  find_package(Torch QUIET)
  unset(CMAKE_CUDA_STANDARD)
  unset(CMAKE_CUDA_STANDARD_REQUIRED)
endmacro()
