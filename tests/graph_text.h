/*
 * graph_text.h: graphs as text for tests.
 *
 *   opset 13                          # default-domain opset (default 17)
 *   input x float[N, 4]               # graph input; dims are numbers or symbols
 *   const w float[4, 2] = random      # initializer: "random", or values (a short
 *   const one float[] = 1             #   list repeats its last value)
 *   y = MatMul(x, w)                  # node; {attr=1, perm=[1,0], mode="x"} after it
 *   z, m = Dropout(y)                 # several outputs; "f(a, , c)" leaves a slot empty
 *   output z                          # graph outputs
 *
 * Control-flow bodies are graphs of their own, written before the node
 * that uses them and named in its attributes with '@'. Inside a body, a
 * name it does not define is read from the graphs around it (the node then
 * captures it); nested bodies nest:
 *
 *   graph add_w                       # If branch: no inputs
 *     t = Add(x, w)                   # x, w: values of the main graph
 *     output t
 *   end
 *   y = If(c) {then_branch=@add_w, else_branch=@other}
 */
#ifndef KF_GRAPH_TEXT_H
#define KF_GRAPH_TEXT_H

#include "kf_pattern.h"
#include "test_util.h"

/* Parses the text into a model (Criterion assertion on malformed text). */
kf_model *gt_parse(const char *text);
/* Live nodes with this op type. */
uint32_t gt_count(const kf_model *m, const char *op_type);
/* Random inputs for the model's real inputs (symbolic dims become 3). */
void gt_random_inputs(const kf_model *m, kf_tensor **ins, uint32_t *nins);
/* Runs both models on the same random inputs; asserts outputs agree. */
void gt_expect_same_outputs(const kf_model *a, const kf_model *b, double atol, double rtol);
/* The same with symbolic dims of a's inputs at base + (symbol id - 1), so
 * different symbols get different sizes. */
void gt_expect_same_outputs_sized(const kf_model *a, const kf_model *b, double atol, double rtol, int64_t base);
/* Registers a rule pass (e.g. kf_pass_noop_rules) into a fresh rule set,
 * runs it to a fixed point on m, and returns the set with its statistics
 * and near misses (caller frees with kf_rules_free). */
kf_ruleset gt_run_rules(kf_model *m, kf_status (*add)(kf_ruleset *));
/* Every near-miss reason of rule `name`, joined by " | "; "" when none.
 * Static buffer. Asserts the rule exists. */
const char *gt_reasons(const kf_ruleset *rs, const char *name);
/* Hits of rule `name` (0 if absent). */
uint64_t gt_hits(const kf_ruleset *rs, const char *name);
/* Calls fn for every .onnx file under dir (recursively), with the data
 * folder beside it (test_data_set_0 or test_data_0) or NULL; returns how
 * many files it found. */
int gt_walk_models(const char *dir, void (*fn)(const char *model, const char *data_dir, void *user), void *user);
/* Deep copy through ONNX serialisation. */
kf_model *gt_copy(const kf_model *m);
/* Reads input_<i>.pb of a test data set folder into ins[i] for m's real
 * inputs real[0..nreal) (by position; a uint16 file for a bfloat16 input
 * is taken as bfloat16). False when a file is missing or bad. */
bool gt_load_dataset_inputs(const kf_model *m, const char *dir, kf_tensor *ins, uint32_t nreal, const kf_id *real);

#endif
