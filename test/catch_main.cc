// The one Catch2 main shared by all test programs (catch_main_dep).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
