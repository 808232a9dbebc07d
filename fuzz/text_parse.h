// ParseText: the text-format parse that kvbrokerd applies to its --pools and
// --auth_tokens files (protobuf's TextFormat into the file's message), with
// the parser's diagnostics counted instead of printed, so that a fuzz run
// does not flood its log.

#ifndef KVBROKER_FUZZ_TEXT_PARSE_H_
#define KVBROKER_FUZZ_TEXT_PARSE_H_

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <string>

namespace kvbroker {
namespace fuzz {

class CountingErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, int, const std::string&) override { ++errors; }
  void AddWarning(int, int, const std::string&) override {}
  int errors = 0;
};

// True when `text` parses as `message` in text format.
inline bool ParseText(const std::string& text,
                      google::protobuf::Message* message) {
  CountingErrors errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  return parser.ParseFromString(text, message);
}

}  // namespace fuzz
}  // namespace kvbroker

#endif  // KVBROKER_FUZZ_TEXT_PARSE_H_
