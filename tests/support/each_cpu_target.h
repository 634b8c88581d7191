#pragma once
// Runs a test body once per CPU target this machine can run (genbridge/core/cpu_target.h), restricting the
// kernels' dispatcher to each in turn, and restores the best target afterwards. The bodies' results are
// compared by the caller: every op must give the same bits on every target.

#include <gtest/gtest.h>

#include <string>

#include "genbridge/core/cpu_target.h"

namespace genbridge::testing {

template <typename Fn>
void for_each_cpu_target(Fn&& fn) {
  for (const std::string& t : cpu_targets_available()) {
    ASSERT_TRUE(set_cpu_target(t).ok()) << t;
    ASSERT_EQ(cpu_target(), t);
    SCOPED_TRACE("cpu target " + t);
    fn(t);
  }
  ASSERT_TRUE(set_cpu_target("best").ok());
}

}  // namespace genbridge::testing
