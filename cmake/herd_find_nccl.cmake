# Finds NCCL in NCCL_HOME (CMake or environment variable) or the CUDA toolkit, and defines the
# target herd_nccl_library carrying its header directory and library (exported with herd's
# package as herd::herd_nccl_library, with the paths found at build time).
find_path(HERD_NCCL_INCLUDE_DIR nccl.h
          HINTS ${NCCL_HOME} $ENV{NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(HERD_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR  # libnccl.so.2: the nvidia-nccl wheel has no libnccl.so;
             # per folder, so that NCCL_HOME wins over a toolkit that has libnccl.so
             HINTS ${NCCL_HOME} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(HERD_NCCL_INCLUDE_DIR AND HERD_NCCL_LIBRARY AND NOT TARGET herd_nccl_library)
  add_library(herd_nccl_library INTERFACE)
  target_include_directories(herd_nccl_library INTERFACE ${HERD_NCCL_INCLUDE_DIR})
  target_link_libraries(herd_nccl_library INTERFACE ${HERD_NCCL_LIBRARY})
endif()
