// huddle_client.run(trainer, options): the client SDK's Run for a Python trainer.
//
// Run blocks until the job ends and calls the trainer from a worker thread of its own, so run():
//   1. starts Run on a thread of its own and waits for it with the GIL released: the trainer's
//      calls (py_trainer.h) take the GIL on the SDK's worker thread, other Python threads run;
//   2. wakes every 100 ms to take the GIL and run the signal handlers (PyErr_CheckSignals; only
//      from the main thread, where Python runs them). Ctrl-C (KeyboardInterrupt), or any
//      exception a handler raises, stops the client:
//        - the trainer's gate closes: no call enters Python any more, and a call in progress gets
//          KeyboardInterrupt raised inside it (a long fit ends at its next bytecode; that round
//          fails for this client);
//        - run() waits, the GIL released, until no call is inside Python;
//        - run() sets the SDK's stop hook (ClientOptions::stop) and waits up to kStopWait (10 s)
//          for Run to return; if it has not returned by then, the thread running Run is left to
//          the process (it holds a reference to the trainer, so the trainer stays alive, and it
//          calls no Python again), and the process should exit soon: its exit then skips the
//          C++ static destructors (which that thread would race), see run.cc;
//        - and re-raises the exception;
//   3. when Run returns, returns; when Run throws, raises huddle_client.Error (Error) or
//      RuntimeError (anything else) with its message.
//
// One run() per trainer at a time (a second raises huddle_client.Error).
#pragma once

#include <pybind11/pybind11.h>

#include "huddle/client/client.h"

namespace huddle::client::python {

// `trainer` is a huddle_client.Trainer instance. Needs the GIL.
void RunPython(pybind11::handle trainer, const ClientOptions& options);

}  // namespace huddle::client::python
