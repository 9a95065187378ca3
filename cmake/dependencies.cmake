# Third-party dependencies. spdlog and fmt are used header-only so that libvcudnn.so needs
# nothing at run time beyond glibc, libstdc++ (and later libsqlite3).
find_package(Threads REQUIRED)
find_package(CUDAToolkit REQUIRED)          # headers only for the library
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(SQLite3 REQUIRED)          # the benchmark cache (micro-batching) links it; the only run-time dependency allowed

# spdlog's packaged header-only target links the compiled libfmt; build our own.
add_library(vcudnn_spdlog INTERFACE)
get_target_property(_spdlog_inc spdlog::spdlog_header_only INTERFACE_INCLUDE_DIRECTORIES)
target_include_directories(vcudnn_spdlog SYSTEM INTERFACE ${_spdlog_inc})
target_compile_definitions(vcudnn_spdlog INTERFACE SPDLOG_FMT_EXTERNAL)
target_link_libraries(vcudnn_spdlog INTERFACE fmt::fmt-header-only Threads::Threads)

# cuDNN: CUDNN_ROOT (cache or environment), the CUDA toolkit, the system, or PyTorch's wheel.
set(CUDNN_ROOT "$ENV{CUDNN_ROOT}" CACHE PATH "cuDNN installation prefix")
find_package(Python3 COMPONENTS Interpreter QUIET)
set(_torch_cudnn "")
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _torch_cudnn OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${_torch_cudnn}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
  HINTS ${CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${_torch_cudnn}
  PATH_SUFFIXES lib lib64)
if(NOT CUDNN_INCLUDE_DIR)
  message(FATAL_ERROR "cudnn.h not found: set CUDNN_ROOT, install cuDNN, or pip install nvidia-cudnn")
endif()
file(STRINGS ${CUDNN_INCLUDE_DIR}/cudnn_version.h _v REGEX "define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCHLEVEL ([0-9]+).*" "\\1.\\2.\\3" CUDNN_VERSION "${_v}")
message(STATUS "cuDNN ${CUDNN_VERSION}: headers ${CUDNN_INCLUDE_DIR}, library ${CUDNN_LIBRARY}")

# Headers only: what the library and runtime compile against.
add_library(vcudnn_cuda_headers INTERFACE)
target_include_directories(vcudnn_cuda_headers SYSTEM INTERFACE ${CUDNN_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
