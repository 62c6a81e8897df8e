package org.sparkflow.exchange;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The little JSON the launcher contract needs: a flat object of strings out, and a flat object of
 * string/number/bool/null values back in. No nesting; no library.
 */
final class Json {
    private Json() {}

    /** {@code {"k":"v",...}} with every key and value escaped. */
    static String object(Map<String, String> values) {
        StringBuilder sb = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<String, String> e : values.entrySet()) {
            if (!first) {
                sb.append(',');
            }
            first = false;
            string(sb, e.getKey());
            sb.append(':');
            string(sb, e.getValue());
        }
        return sb.append('}').toString();
    }

    /** Appends s as a JSON string literal: quotes, backslash and every control character escaped. */
    static void string(StringBuilder sb, String s) {
        sb.append('"');
        if (s != null) {
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                switch (c) {
                    case '"': sb.append("\\\""); break;
                    case '\\': sb.append("\\\\"); break;
                    case '\n': sb.append("\\n"); break;
                    case '\r': sb.append("\\r"); break;
                    case '\t': sb.append("\\t"); break;
                    case '\b': sb.append("\\b"); break;
                    case '\f': sb.append("\\f"); break;
                    default:
                        if (c < 0x20 || c == 0x7f || c == '\u2028' || c == '\u2029') {
                            sb.append(String.format("\\u%04x", (int) c));
                        } else {
                            sb.append(c);
                        }
                }
            }
        }
        sb.append('"');
    }

    /**
     * Parses a flat JSON object. Values that are strings come back unescaped; numbers, true, false
     * come back as their literal text; null as Java null. Nested objects/arrays are rejected.
     */
    static Map<String, String> parseFlat(String json) {
        Parser p = new Parser(json);
        Map<String, String> out = new LinkedHashMap<>();
        p.skipWs();
        p.expect('{');
        p.skipWs();
        if (p.peek() == '}') {
            p.pos++;
        } else {
            while (true) {
                p.skipWs();
                String key = p.string();
                p.skipWs();
                p.expect(':');
                p.skipWs();
                out.put(key, p.scalar());
                p.skipWs();
                char c = p.next();
                if (c == '}') {
                    break;
                }
                if (c != ',') {
                    throw p.error("expected ',' or '}'");
                }
            }
        }
        p.skipWs();
        if (p.pos != json.length()) {
            throw p.error("trailing characters");
        }
        return out;
    }

    private static final class Parser {
        final String s;
        int pos;

        Parser(String s) {
            this.s = s;
        }

        IllegalArgumentException error(String what) {
            return new IllegalArgumentException("bad JSON at " + pos + " (" + what + "): " + s);
        }

        char peek() {
            if (pos >= s.length()) {
                throw error("unexpected end");
            }
            return s.charAt(pos);
        }

        char next() {
            char c = peek();
            pos++;
            return c;
        }

        void expect(char c) {
            if (next() != c) {
                pos--;
                throw error("expected '" + c + "'");
            }
        }

        void skipWs() {
            while (pos < s.length() && " \t\r\n".indexOf(s.charAt(pos)) >= 0) {
                pos++;
            }
        }

        String scalar() {
            char c = peek();
            if (c == '"') {
                return string();
            }
            if (c == '{' || c == '[') {
                throw error("nested values are not supported");
            }
            int start = pos;
            while (pos < s.length() && ",} \t\r\n".indexOf(s.charAt(pos)) < 0) {
                pos++;
            }
            String literal = s.substring(start, pos);
            if (literal.isEmpty()) {
                throw error("missing value");
            }
            if (literal.equals("null")) {
                return null;
            }
            if (!literal.equals("true") && !literal.equals("false") && !literal.matches("-?\\d+(\\.\\d+)?([eE][+-]?\\d+)?")) {
                throw error("unknown literal " + literal);
            }
            return literal;
        }

        String string() {
            expect('"');
            StringBuilder sb = new StringBuilder();
            while (true) {
                char c = next();
                if (c == '"') {
                    return sb.toString();
                }
                if (c != '\\') {
                    sb.append(c);
                    continue;
                }
                char e = next();
                switch (e) {
                    case '"': case '\\': case '/': sb.append(e); break;
                    case 'n': sb.append('\n'); break;
                    case 'r': sb.append('\r'); break;
                    case 't': sb.append('\t'); break;
                    case 'b': sb.append('\b'); break;
                    case 'f': sb.append('\f'); break;
                    case 'u':
                        if (pos + 4 > s.length()) {
                            throw error("short \\u escape");
                        }
                        try {
                            sb.append((char) Integer.parseInt(s.substring(pos, pos + 4), 16));
                        } catch (NumberFormatException ex) {
                            throw error("bad \\u escape");
                        }
                        pos += 4;
                        break;
                    default:
                        throw error("bad escape \\" + e);
                }
            }
        }
    }
}
