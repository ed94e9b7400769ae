// psd's scheduling priority (psd --nice).
//
// On a host where workers run beside psd, every worker waits on psd, yet
// each worker that wakes from a network wait can preempt psd's thread.
// A lower nice value keeps psd running while a worker is runnable.
//
//   ps::set_process_nice(-10);  // before serving: threads started later inherit it
#pragma once

namespace ps {

// Sets the nice value (-20..19, as nice(1)) of every thread of this
// process; threads started afterwards inherit it. Throws ConfigError when
// the value is out of range or not permitted (below the current value
// needs root, CAP_SYS_NICE or a raised RLIMIT_NICE), with no thread
// changed in the second case unless a thread ends midway.
void set_process_nice(int nice);

}  // namespace ps
