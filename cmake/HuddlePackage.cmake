# Debian packages of the install rules (cmake/HuddleInstall.cmake), one per component:
#
#   huddle                 the huddle binary, its systemd units, the Grafana dashboard (cli)
#   huddle-cuda            the CUDA plugin, so that CPU-only hosts never pull CUDA (cuda)
#   libhuddle-client0      the client SDK's shared library (sdk)
#   libhuddle-client-dev   its headers, link-time name and CMake package (sdk-dev)
#   python3-huddle-client  the Python binding (python)
#
# `scripts/package.sh` configures, builds and runs cpack -G DEB (files in BUILD/packages/). Each
# package's Depends are computed from its binaries by dpkg-shlibdeps (libraries of Debian's
# packages only: no -dev package, no build tool), plus the packages of this project it needs at
# the same version. The CUDA plugin's CUDA libraries (cuBLAS, cuBLASLt, NCCL) are NVIDIA's, not
# Debian's: huddle-cuda names NVIDIA's runtime packages of the toolkit it was built with.
#
# The packages' version is the release, the number of commits and the git revision the binaries
# were built from (cmake/HuddleCPackVersion.cmake, at packaging time): 0.1.0+git512.b59c7c3a1d2e,
# ".dirty" appended when the tree had changes; `huddle --version` prints the same revision.
# `make install` and cpack's install step build only what they install (scripts/package.sh
# builds the shipped targets), not the tests.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME huddle)
set(CPACK_PACKAGE_VENDOR "Huddle")
set(CPACK_PACKAGE_CONTACT "Huddle developers <huddle@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Federated and privacy-preserving training")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_OUTPUT_FILE_PREFIX packages)
set(CPACK_STRIP_FILES ON)
# Computes the version from the build's generated common/version.cc, at cpack time.
set(CPACK_HUDDLE_VERSION_SOURCE ${PROJECT_BINARY_DIR}/common/version.cc)
set(CPACK_HUDDLE_SOURCE_DIR ${PROJECT_SOURCE_DIR})
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/cmake/HuddleCPackVersion.cmake)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL cli sdk sdk-dev)
if(TARGET huddle_cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
if(TARGET huddle_client_python)
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/huddle/huddle")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Control files are written with policy permissions (0644), not the source tree's.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_CLI_PACKAGE_NAME huddle)
set(CPACK_DEBIAN_CLI_DESCRIPTION "Federated and privacy-preserving training: the huddle binary
 The coordinator, the long-running service (huddle serve) and its agents (huddle agent), the
 operator commands, site provisioning (huddle provision), reports (huddle report) and the
 datacenter mode, on the CPU (Eigen; Gloo between ranks). Ships the systemd units huddle.service
 and huddle-agent@.service. The CUDA backend is the huddle-cuda package.")
set(CPACK_DEBIAN_CLI_PACKAGE_SUGGESTS "huddle-cuda")

set(CPACK_DEBIAN_CUDA_PACKAGE_NAME huddle-cuda)
set(CPACK_DEBIAN_CUDA_DESCRIPTION "Federated and privacy-preserving training: the CUDA backend
 The plugin (libhuddle_cuda.so) that the huddle binary loads when a CUDA device is asked for:
 CUDA kernels and the NCCL collective of the datacenter mode. Needs NVIDIA's driver and the CUDA
 runtime libraries of NVIDIA's repository (cuBLAS, NCCL).")
# dpkg-shlibdeps knows no Debian package for NVIDIA's libraries: the plugin's Depends are written
# here, from the toolkit it was built with. libhuddle_cuda.so's other libraries (abseil, fmt) are
# the huddle binary's too, so the exact huddle dependency brings them.
set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
if(TARGET huddle_cuda)
  set(cuda_suffix "${CUDAToolkit_VERSION_MAJOR}-${CUDAToolkit_VERSION_MINOR}")
  set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS
    "libcublas-${cuda_suffix}, libnccl2 (>= 2.0) | cuda-libraries-${cuda_suffix}")
endif()

set(CPACK_DEBIAN_SDK_PACKAGE_NAME libhuddle-client0)
set(CPACK_DEBIAN_SDK_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_SDK_DESCRIPTION "Federated and privacy-preserving training: client SDK library
 libhuddle_client.so.0: a site's own trainer (C++) joins a Huddle federation with the same agent
 as huddle client (CurveZMQ, privacy policy and ledger, clipping, noise, secure aggregation).")
set(CPACK_DEBIAN_SDK_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_SDK-DEV_PACKAGE_NAME libhuddle-client-dev)
set(CPACK_DEBIAN_SDK-DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_SDK-DEV_DESCRIPTION "Federated and privacy-preserving training: client SDK development files
 The headers (huddle/client/client.h, trainer.h, C++17 and the standard library only), the
 link-time library name and the CMake package: find_package(Huddle 0.1) and Huddle::client.")
set(CPACK_DEBIAN_SDK-DEV_PACKAGE_SHLIBDEPS OFF)

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-huddle-client)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_DESCRIPTION "Federated and privacy-preserving training: Python client SDK
 The huddle_client module: a Python trainer (numpy arrays; PyTorch or any other framework) joins
 a Huddle federation through the client SDK.")
# The module needs libhuddle_client.so.0 (the exact libhuddle-client0, below) and the C++ runtime
# that package brings: dpkg-shlibdeps cannot see a library of a package being built beside it.
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
if(TARGET huddle_client_python)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3 (>= ${HUDDLE_PYTHON_VERSION}~), python3 (<< ${HUDDLE_PYTHON_NEXT_VERSION}~), python3-numpy")
endif()

# Dependencies between this project's packages, at the exact version (the CUDA plugin and the
# binary are one build: kernels/cuda_plugin.h refuses a plugin of another build).
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_COMPONENT_CUDA_DEPENDS cli)
set(CPACK_COMPONENT_SDK-DEV_DEPENDS sdk)
set(CPACK_COMPONENT_PYTHON_DEPENDS sdk)

include(CPack)
