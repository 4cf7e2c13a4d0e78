// dsinfer tokenizer floor: native chat-template renderers (no Jinja engine). The family is
// recognised from the chat_template text of tokenizer_config.json (or, for DeepSeek
// V3.2/V4 checkpoints that ship a Python encoder instead of a template, from the presence of
// DeepSeek's role tokens); each renderer reproduces the byte-exact output of the reference
// template for plain-text messages (roles system/user/assistant/tool; no tool schemas or
// tool calls). The exact strings are documented in docs/TOKENIZER.md and pinned by tests.
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer {

namespace {

constexpr const char* kDsBos = "<｜begin▁of▁sentence｜>";
constexpr const char* kDsEos = "<｜end▁of▁sentence｜>";
constexpr const char* kDsUser = "<｜User｜>";
constexpr const char* kDsAssistant = "<｜Assistant｜>";

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

std::string lstrip_nl(const std::string& s) {
  size_t a = s.find_first_not_of('\n');
  return a == std::string::npos ? std::string() : s.substr(a);
}
std::string rstrip_nl(const std::string& s) {
  size_t b = s.find_last_not_of('\n');
  return b == std::string::npos ? std::string() : s.substr(0, b + 1);
}
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

[[noreturn]] void bad_role(const std::string& role, const char* family) {
  throw Error("chat template: role '" + role + "' is not supported by the " + family + " format");
}

// Qwen3 (and Qwen2.5) ChatML, following Qwen3's template for messages without tools.
std::string render_chatml(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, const ChatOptions& o) {
  const std::string& tpl = tok.chat_template_source();
  std::string out;
  const size_t n = msgs.size();
  bool has_system = n > 0 && msgs[0].role == "system";
  // Qwen2.5's template injects a default system prompt; Qwen3's does not.
  const char* kQwen25Default = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  if (has_system) out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  else if (contains(tpl, kQwen25Default)) out += std::string("<|im_start|>system\n") + kQwen25Default + "<|im_end|>\n";

  // Index of the last real user query (tool responses wrapped as user turns do not count).
  size_t last_query = n ? n - 1 : 0;
  for (size_t k = n; k-- > 0;) {
    const auto& m = msgs[k];
    if (m.role == "user" && !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "system") {
      // first system message: rendered above
    } else if (m.role == "assistant") {
      std::string content = m.content, reasoning;
      size_t close = content.find("</think>");
      if (close != std::string::npos) {
        std::string before = rstrip_nl(content.substr(0, close));
        size_t open = before.rfind("<think>");
        reasoning = lstrip_nl(open == std::string::npos ? before : before.substr(open + 7));
        content = lstrip_nl(content.substr(content.rfind("</think>") + 8));
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty()))
        out += "<|im_start|>assistant\n<think>\n" + rstrip_nl(lstrip_nl(reasoning)) + "\n</think>\n\n" + lstrip_nl(content);
      else
        out += "<|im_start|>assistant\n" + content;
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      bad_role(m.role, "Qwen3 ChatML");
    }
  }
  if (o.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!o.enable_thinking && contains(tpl, "enable_thinking")) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// DeepSeek-V3 (2024-12) template: system prompts joined at the top, no thinking markers.
std::string render_deepseek_v3(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, const ChatOptions& o) {
  std::string system;
  bool first_sp = true;
  for (const auto& m : msgs) {
    if (m.role != "system") continue;
    system += (first_sp ? "" : "\n\n") + m.content;
    first_sp = false;
  }
  std::string out = (tok.bos_token().empty() ? std::string(kDsBos) : tok.bos_token()) + system;
  bool is_tool = false, is_output_first = true;
  for (const auto& m : msgs) {
    if (m.role == "system") continue;
    if (m.role == "user") {
      is_tool = false;
      out += kDsUser + m.content;
    } else if (m.role == "assistant") {
      if (is_tool) out += "<｜tool▁outputs▁end｜>" + m.content + kDsEos;
      else out += kDsAssistant + m.content + kDsEos;
      is_tool = false;
    } else if (m.role == "tool") {
      is_tool = true;
      // The reference template never resets is_output_first; reproduced as is.
      if (is_output_first) out += "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" + m.content + "<｜tool▁output▁end｜>";
      else out += "\n<｜tool▁output▁begin｜>" + m.content + "<｜tool▁output▁end｜>";
      is_output_first = false;
    } else {
      bad_role(m.role, "DeepSeek-V3");
    }
  }
  if (is_tool) out += "<｜tool▁outputs▁end｜>";
  if (o.add_generation_prompt && !is_tool) out += kDsAssistant;
  return out;
}

// DeepSeek V3.1/V3.2/V4 (encoding_dsv4.py rules, drop_thinking on, no tools): tool results
// are merged into user turns as <tool_result> blocks, a user turn that is followed by an
// assistant turn (or ends the prompt) gets "<｜Assistant｜>" plus "<think>" when thinking for
// the latest query, else "</think>"; assistant turns after the latest user turn carry their
// (empty) reasoning closed by "</think>" in thinking mode.
std::string render_deepseek_v4(const Tokenizer& tok, const std::vector<ChatMessage>& in, const ChatOptions& o) {
  struct Msg { std::string role; std::vector<std::string> blocks; std::string content; };
  std::vector<Msg> msgs;
  for (const auto& m : in) {
    if (m.role == "tool" || m.role == "user") {
      std::string block = m.role == "tool" ? "<tool_result>" + m.content + "</tool_result>" : m.content;
      if (!msgs.empty() && msgs.back().role == "user") msgs.back().blocks.push_back(block);
      else msgs.push_back({"user", {block}, ""});
    } else if (m.role == "system" || m.role == "assistant") {
      msgs.push_back({m.role, {}, m.content});
    } else {
      bad_role(m.role, "DeepSeek-V4");
    }
  }
  const bool thinking = o.enable_thinking;
  long last_user = -1;
  for (size_t k = 0; k < msgs.size(); ++k)
    if (msgs[k].role == "user") last_user = static_cast<long>(k);

  std::string out = tok.bos_token().empty() ? std::string(kDsBos) : tok.bos_token();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Msg& m = msgs[i];
    if (m.role == "system") {
      out += m.content;
    } else if (m.role == "user") {
      out += kDsUser;
      for (size_t b = 0; b < m.blocks.size(); ++b) out += (b ? "\n\n" : "") + m.blocks[b];
    } else {  // assistant
      if (thinking && static_cast<long>(i) > last_user) out += "</think>";
      out += m.content + kDsEos;
    }
    bool last = i + 1 == msgs.size();
    if (!last && msgs[i + 1].role != "assistant") continue;
    if (m.role != "user") continue;
    if (last && !o.add_generation_prompt) continue;
    out += kDsAssistant;
    out += (thinking && static_cast<long>(i) >= last_user) ? "<think>" : "</think>";
  }
  return out;
}

}  // namespace

ChatFamily detect_chat_family(const Tokenizer& tok) {
  const std::string& t = tok.chat_template_source();
  if (contains(t, "<|im_start|>") && contains(t, "<|im_end|>")) return ChatFamily::Qwen3ChatML;
  if (contains(t, kDsUser) && contains(t, kDsAssistant)) {
    // DeepSeek-R1's template opens "<think>\n" itself: a different format, not rendered.
    if (contains(t, "<｜Assistant｜><think>\\n")) return ChatFamily::None;
    // V3.1-style templates switch on thinking and emit "</think>"; V3's never mentions it.
    if (contains(t, "</think>") || contains(t, "thinking")) return ChatFamily::DeepSeekV4;
    return ChatFamily::DeepSeekV3;
  }
  // DeepSeek V3.2 / V4 ship encoding_dsv*.py instead of a chat_template.
  if (t.empty() && tok.token_to_id(kDsUser) && tok.token_to_id(kDsAssistant)) return ChatFamily::DeepSeekV4;
  return ChatFamily::None;
}

std::string apply_chat_template(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                const ChatOptions& opts) {
  switch (detect_chat_family(tok)) {
    case ChatFamily::Qwen3ChatML: return render_chatml(tok, messages, opts);
    case ChatFamily::DeepSeekV3: return render_deepseek_v3(tok, messages, opts);
    case ChatFamily::DeepSeekV4: return render_deepseek_v4(tok, messages, opts);
    case ChatFamily::None: break;
  }
  throw Error("tokenizer_config.json: field 'chat_template': not a recognised chat format "
              "(supported: Qwen3 ChatML, DeepSeek-V3, DeepSeek-V3.1/V3.2/V4)");
}

}  // namespace dsinfer
