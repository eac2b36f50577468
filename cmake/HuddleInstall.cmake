# `cmake --install build --prefix PREFIX` (docs/deployment.md, "Installing the client SDK"):
#
#   PREFIX/bin/huddle                                   the binary                  (component cli)
#   PREFIX/bin/libhuddle_cuda.so                        its CUDA plugin, if built   (component cli)
#   PREFIX/lib/libhuddle_client.so.0.1.0 (+ .so.0, .so) the client SDK              (component sdk)
#   PREFIX/include/huddle/client/{client,trainer}.h     its public headers          (component sdk)
#   PREFIX/lib/cmake/Huddle/Huddle{Config,ConfigVersion,Targets*}.cmake             (component sdk)
#
# (lib is CMAKE_INSTALL_LIBDIR: lib/x86_64-linux-gnu under the prefix /usr.) A consumer writes
# find_package(Huddle 0.1 REQUIRED) and links Huddle::client; see examples/embed_client/.
#
# The CUDA plugin goes next to the binary: the loader looks there first (kernels/cuda_plugin.h,
# /proc/self/exe's directory), as it does in the build tree (build/cli/), so the installed layout
# needs no second search rule. It keeps the CUDA toolkit's directory of the build in its RUNPATH
# (the loader's path, LD_LIBRARY_PATH first, still decides on another host).
include(CMakePackageConfigHelpers)

set(HUDDLE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Huddle)

install(TARGETS huddle RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
if(TARGET huddle_cuda)
  set_target_properties(huddle_cuda PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS huddle_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()

install(TARGETS huddle_client_sdk EXPORT HuddleTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk NAMELINK_COMPONENT sdk)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/huddle
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT sdk
  FILES_MATCHING PATTERN "*.h")
install(EXPORT HuddleTargets NAMESPACE Huddle:: FILE HuddleTargets.cmake
  DESTINATION ${HUDDLE_INSTALL_CMAKEDIR} COMPONENT sdk)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/HuddleConfig.cmake.in
  ${PROJECT_BINARY_DIR}/HuddleConfig.cmake
  INSTALL_DESTINATION ${HUDDLE_INSTALL_CMAKEDIR}
  NO_SET_AND_CHECK_MACRO)
# 0.x: every 0.y release may be asked for as 0.1; the SONAME (libhuddle_client.so.0) follows the
# major version too.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/HuddleConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/HuddleConfig.cmake ${PROJECT_BINARY_DIR}/HuddleConfigVersion.cmake
  DESTINATION ${HUDDLE_INSTALL_CMAKEDIR} COMPONENT sdk)
