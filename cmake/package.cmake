# cmake/package.cmake - attnkit as an installable library. Included at the end
# of CMakeLists.txt, once the targets exist:
#   - the version compiled into the library (ak_version, src/core/version.c);
#   - the ABI: hidden visibility, only the AK_API functions of attnkit.h
#     exported, a SONAME that carries the version;
#   - the link interface a C program needs for the static library;
#   - install rules, the CMake package (attnkit::attnkit, the shared library;
#     attnkit::attnkit_static) and attnkit.pc for pkg-config;
#   - the wheel's copy of libattnkit.so (pip install ., pyproject.toml);
#   - tests: the exported symbols, and a consumer built three ways.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
include(CheckLinkerFlag)

# attnkit is the top-level project, not a subdirectory of an application's build
string(COMPARE EQUAL "${CMAKE_SOURCE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}" AK_TOP_LEVEL)
option(AK_INSTALL "Generate the install rules (default: when attnkit is the top-level project)"
       ${AK_TOP_LEVEL})

# ---- version ------------------------------------------------------------------------
# project()'s version, passed to the one file that reports it.
if(attnkit_VERSION_PATCH STREQUAL "" OR attnkit_VERSION_MINOR GREATER 99
   OR attnkit_VERSION_PATCH GREATER 99)
  message(FATAL_ERROR "project(attnkit VERSION ...) must be major.minor.patch with minor and "
                      "patch below 100 (ak_version() is major * 10000 + minor * 100 + patch)")
endif()
target_sources(attnkit PRIVATE src/core/version.c)
set_property(SOURCE src/core/version.c APPEND PROPERTY COMPILE_DEFINITIONS
             AK_VERSION_MAJOR=${attnkit_VERSION_MAJOR} AK_VERSION_MINOR=${attnkit_VERSION_MINOR}
             AK_VERSION_PATCH=${attnkit_VERSION_PATCH})

# ---- ABI: only the public API leaves the shared library ------------------------------
# Every object of the library is compiled with hidden visibility (the C files
# and the host code of the .cu files), so libattnkit.so exports exactly the
# functions attnkit.h marks AK_API. The static library holds the same objects:
# the tests and tools link it and may call internal functions, which visibility
# does not restrict within one link.
target_compile_options(attnkit PRIVATE $<$<COMPILE_LANGUAGE:C>:-fvisibility=hidden>
                                       $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fvisibility=hidden>)
if(TARGET attnkit_wgmma)
  target_compile_options(attnkit_wgmma PRIVATE -Xcompiler=-fvisibility=hidden)
endif()

# ---- the static library's link interface ---------------------------------------------
# libm, OpenMP and cudart_static (which brings dl, rt and pthread) are on it
# already (CMakeLists.txt). The host code of the .cu objects also calls the C++
# runtime (thread-safe statics, the exception personality): a program linked
# by the C compiler, which CMake uses for a C project, must be given it, or the
# link fails on __cxa_guard_acquire and __gxx_personality_v0.
set(AK_CXX_RUNTIME "")
if(AK_HAVE_CUDA)
  foreach(lib IN LISTS CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES)
    if(lib MATCHES "^(stdc\\+\\+|c\\+\\+)$")
      list(APPEND AK_CXX_RUNTIME ${lib})
    endif()
  endforeach()
  if(NOT AK_CXX_RUNTIME)
    set(AK_CXX_RUNTIME stdc++)
  endif()
  target_link_libraries(attnkit INTERFACE ${AK_CXX_RUNTIME})
endif()

# ---- targets as consumers name them ----------------------------------------------------
# attnkit::attnkit is the shared library, attnkit::attnkit_static the archive,
# in the installed package and under add_subdirectory alike. An AK_SANITIZE
# build makes no shared library; there attnkit::attnkit is the archive.
set_target_properties(attnkit PROPERTIES EXPORT_NAME attnkit_static)
add_library(attnkit::attnkit_static ALIAS attnkit)
if(TARGET attnkit_shared)
  # SONAME libattnkit.so.MAJOR.MINOR: before 1.0 a minor version may change the ABI
  set_target_properties(attnkit_shared PROPERTIES
                        VERSION ${attnkit_VERSION}
                        SOVERSION ${attnkit_VERSION_MAJOR}.${attnkit_VERSION_MINOR}
                        EXPORT_NAME attnkit)
  target_include_directories(attnkit_shared INTERFACE
                             $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
  # Archives linked into the .so (cudart_static) export nothing from it, and a
  # symbol the library calls but nothing provides fails the link, not the load.
  check_linker_flag(C "-Wl,--exclude-libs,ALL" AK_LD_EXCLUDE_LIBS)
  if(AK_LD_EXCLUDE_LIBS)
    target_link_options(attnkit_shared PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined)
  endif()
  add_library(attnkit::attnkit ALIAS attnkit_shared)
else()
  add_library(attnkit::attnkit ALIAS attnkit)
endif()

# ---- install: headers, libraries, tools, the CMake package, pkg-config ----------------
if(AK_INSTALL)
  set(AK_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/attnkit)
  set(AK_LIBRARY_TARGETS attnkit)
  if(TARGET attnkit_shared)
    list(APPEND AK_LIBRARY_TARGETS attnkit_shared)
  endif()
  install(TARGETS ${AK_LIBRARY_TARGETS} EXPORT attnkit-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(FILES include/attnkit.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS attnkit-info attnkit-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(FILES LICENSE README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

  install(EXPORT attnkit-targets NAMESPACE attnkit:: FILE attnkit-targets.cmake
          DESTINATION ${AK_CMAKE_DIR})
  # what the config file must look up for attnkit::attnkit_static
  set(AK_PACKAGE_OPENMP OFF)
  if(OpenMP_C_FOUND)
    set(AK_PACKAGE_OPENMP ON)
  endif()
  configure_package_config_file(cmake/attnkit-config.cmake.in
                                ${CMAKE_CURRENT_BINARY_DIR}/attnkit-config.cmake
                                INSTALL_DESTINATION ${AK_CMAKE_DIR})
  # before 1.0 a minor version may break the API: 0.2.x satisfies a request for 0.2
  write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/attnkit-config-version.cmake
                                   VERSION ${attnkit_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/attnkit-config.cmake
                ${CMAKE_CURRENT_BINARY_DIR}/attnkit-config-version.cmake
          DESTINATION ${AK_CMAKE_DIR})

  # attnkit.pc. Libs.private: what linking libattnkit.a needs besides itself,
  # the same list as the static target's link interface, as linker flags.
  set(AK_PC_LIBS_PRIVATE "")
  macro(ak_pc_add_lib lib)
    if(IS_ABSOLUTE "${lib}")
      get_filename_component(ak_pc_dir "${lib}" DIRECTORY)
      get_filename_component(ak_pc_file "${lib}" NAME)
      string(REGEX REPLACE "^lib(.*)\\.(so|a)(\\..*)?$" "\\1" ak_pc_name "${ak_pc_file}")
      string(APPEND AK_PC_LIBS_PRIVATE " -L${ak_pc_dir} -l${ak_pc_name}")
    elseif("${lib}" MATCHES "^-")
      string(APPEND AK_PC_LIBS_PRIVATE " ${lib}")
    else()
      string(APPEND AK_PC_LIBS_PRIVATE " -l${lib}")
    endif()
  endmacro()
  if(OpenMP_C_FOUND)
    foreach(lib IN LISTS OpenMP_C_LIBRARIES)
      ak_pc_add_lib("${lib}")
    endforeach()
  endif()
  if(AK_HAVE_CUDA)
    ak_pc_add_lib("${CUDA_cudart_static_LIBRARY}")
    foreach(lib IN ITEMS dl rt pthread ${AK_CXX_RUNTIME})
      ak_pc_add_lib(${lib})
    endforeach()
  endif()
  ak_pc_add_lib(m)
  string(STRIP "${AK_PC_LIBS_PRIVATE}" AK_PC_LIBS_PRIVATE)
  # the prefix relative to the .pc file, so that the tree may be installed
  # anywhere (cmake --install --prefix) or moved
  file(RELATIVE_PATH AK_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" AK_PC_PREFIX_FROM_PCDIR "${AK_PC_PREFIX_FROM_PCDIR}")
  configure_file(cmake/attnkit.pc.in ${CMAKE_CURRENT_BINARY_DIR}/attnkit.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/attnkit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()

# ---- the Python wheel (pip install ., pyproject.toml) ----------------------------------
# scikit-build-core builds attnkit_shared and installs only this component: the
# library as attnkit/libattnkit.so beside the binding (one file, no symlinks,
# which a wheel would store as copies).
if(SKBUILD AND TARGET attnkit_shared)
  install(FILES $<TARGET_FILE:attnkit_shared> DESTINATION attnkit RENAME libattnkit.so
          COMPONENT python)
endif()

# ---- tests: the exported symbols, and consumers of the library -------------------------
# the tools report the library's version
if(AK_TOP_LEVEL)
  foreach(tool IN ITEMS attnkit-info attnkit-bench)
    add_test(NAME ${tool}_version COMMAND ${tool} --version)
    string(REPLACE "." "\\." ak_version_regex "${attnkit_VERSION}")
    set_tests_properties(${tool}_version PROPERTIES PASS_REGULAR_EXPRESSION "^attnkit ${ak_version_regex}\n$")
  endforeach()
endif()
if(AK_TOP_LEVEL AND TARGET attnkit_shared)
  add_test(NAME exports COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/check_exports.sh
                                $<TARGET_FILE:attnkit_shared> ${CMAKE_CURRENT_SOURCE_DIR}/include/attnkit.h)
  set_tests_properties(exports PROPERTIES SKIP_RETURN_CODE 77)

  # tests/consumer: a C project outside this build that runs a decode step.
  # consumer_install puts this build into build/consumer/prefix; the package
  # and pkgconfig modes build the consumer against that tree (the C link of
  # this build's CUDA objects, the sm_90a ones included), the subdir mode
  # against the source tree (add_subdirectory, which compiles the library
  # again, CUDA included when this build has it). That second compile is for
  # sm_80 alone: it links the same way, compiles the mma.sync kernels' code
  # for the Ampere GPUs they serve, and leaves out the wgmma kernels'
  # (sm_90a, the longest compile), which this build has already compiled.
  set(AK_CONSUMER_RUN ${CMAKE_COMMAND} -E env CC=${CMAKE_C_COMPILER} CMAKE=${CMAKE_COMMAND}
                      CMAKE_GENERATOR=${CMAKE_GENERATOR} bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/consumer/run.sh)
  set(AK_CONSUMER_DIR ${CMAKE_CURRENT_BINARY_DIR}/consumer)
  set(AK_CONSUMER_SUBDIR_ARGS -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE})
  if(AK_HAVE_CUDA)
    list(APPEND AK_CONSUMER_SUBDIR_ARGS -DAK_CUDA=ON -DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}
         -DCMAKE_CUDA_ARCHITECTURES=80)
  else()
    list(APPEND AK_CONSUMER_SUBDIR_ARGS -DAK_CUDA=OFF)
  endif()
  if(AK_INSTALL)
    add_test(NAME consumer_install
             COMMAND ${AK_CONSUMER_RUN} install ${CMAKE_CURRENT_BINARY_DIR} ${AK_CONSUMER_DIR}/prefix)
    add_test(NAME consumer_package
             COMMAND ${AK_CONSUMER_RUN} package ${AK_CONSUMER_DIR}/prefix ${AK_CONSUMER_DIR}/package
                     ${attnkit_VERSION})
    add_test(NAME consumer_pkgconfig
             COMMAND ${AK_CONSUMER_RUN} pkgconfig ${AK_CONSUMER_DIR}/prefix ${AK_CONSUMER_DIR}/pkgconfig
                     ${attnkit_VERSION})
    set_tests_properties(consumer_install PROPERTIES FIXTURES_SETUP ak_installed LABELS consumer)
    set_tests_properties(consumer_package consumer_pkgconfig PROPERTIES
                         FIXTURES_REQUIRED ak_installed LABELS consumer SKIP_RETURN_CODE 77)
  endif()
  add_test(NAME consumer_subdir
           COMMAND ${AK_CONSUMER_RUN} subdir ${CMAKE_CURRENT_SOURCE_DIR} ${AK_CONSUMER_DIR}/subdir
                   ${attnkit_VERSION} ${AK_CONSUMER_SUBDIR_ARGS})
  set_tests_properties(consumer_subdir PROPERTIES LABELS consumer TIMEOUT 1800)
endif()
