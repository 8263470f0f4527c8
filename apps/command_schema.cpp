// scape schema: the JSON Schema of experiment or prediction configs.
#include <iostream>

#include "apps/cli_common.hpp"
#include "predict/predict_config.hpp"

namespace scape::cli {

Command add_schema_command(CLI::App& app) {
  const auto predict_schema = std::make_shared<bool>(false);
  auto* schema = app.add_subcommand(
      "schema", "print the JSON Schema of experiment configs (or of prediction configs with --predict); keys say "
                "in x-applies-to which model, data or optimizer types read them");
  schema->add_flag("--predict", *predict_schema, "the schema of `scape predict` configs instead");
  Command c;
  c.sub = schema;
  c.run = [predict_schema] {
    std::cout << (*predict_schema ? scape::predict::predict_schema() : cfg::experiment_schema()).dump(2) << "\n";
    return kExitOk;
  };
  return c;
}

}  // namespace scape::cli
